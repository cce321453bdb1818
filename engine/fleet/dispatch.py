"""Where requests go and how they end: queued prompts to prefill (or mixed) workers, a request
recomputed from its tokens on a survivor, and the end of a request (finished or failed) with every
copy of it released on the workers."""

import time

from fleetctl.engine.fleet.request import RequestStage, StreamEvent, TrackedRequest
from fleetctl.engine.fleet.router import WorkerView
from fleetctl.engine.fleet.state import FleetState
from fleetctl.engine.worker import protocol as m
from fleetctl.store.records import WorkerRole


class Dispatcher:
    def __init__(self, state: FleetState) -> None:
        self.state = state

    def dispatch_queued(self) -> None:
        state = self.state
        while state.queued:
            req = state.queued[0]
            if req.done:
                state.queued.popleft()
                continue
            view = state.router.pick_prefill_worker(state.all_views(), state.config.prompt_role)
            if view is None:
                return
            state.queued.popleft()
            self.run_on(req, view)

    def run_on(self, req: TrackedRequest, view: WorkerView) -> None:
        """Prefill `req` (prompt and any output so far) on `view`'s worker."""
        req.stage = RequestStage.PREFILL
        req.prefill_worker = view.worker_id
        view.requests.add(req.request_id)
        self.state.send(view.worker_id, _run_request(req))

    def recompute(self, req: TrackedRequest, role: WorkerRole) -> None:
        """Re-run the request from its tokens on a surviving worker of `role` (decode workers prefill
        the tokens themselves)."""
        state = self.state
        req.recomputes += 1
        if role is WorkerRole.DECODE:
            view = state.router.pick_decode_worker(state.all_views(), 0)
        else:
            view = state.router.pick_prefill_worker(state.all_views(), role)
        if view is None:
            if not state.has_role(role):
                self.fail(req, f"no {role.value} worker is left to continue this request")
            else:
                req.stage = RequestStage.QUEUED
                state.queued.appendleft(req)
            return
        if role is not WorkerRole.DECODE:
            self.run_on(req, view)
            return
        req.stage, req.decode_worker = RequestStage.DECODE, view.worker_id
        view.requests.add(req.request_id)
        state.send(view.worker_id, _run_request(req))

    def queue_length(self, role: WorkerRole) -> int:
        """Requests waiting for a worker of `role` in the controller (prompts, or handoffs for decode)."""
        waiting = self.state.pending_handoffs if role is WorkerRole.DECODE else self.state.queued
        return sum(1 for r in waiting if not r.done)

    # ---- endings ---------------------------------------------------------------------------------

    def finish(self, req: TrackedRequest, reason: str, last: StreamEvent | None = None) -> None:
        req.stage, req.finish_reason = RequestStage.DONE, reason
        req.times.finished = time.time()
        if req.handle is not None:
            self.release_prefill_copy(req)
        req.events.put_nowait(last or StreamEvent(finish_reason=reason))
        self._retire(req)

    def fail(self, req: TrackedRequest, message: str) -> None:
        if req.done:
            return
        req.stage, req.error = RequestStage.DONE, message
        req.times.finished = time.time()
        req.events.put_nowait(StreamEvent(error=message))
        self._retire(req)

    def _retire(self, req: TrackedRequest) -> None:
        state = self.state
        state.requests.pop(req.request_id, None)
        state.stats.on_request_done(req)
        if state.recorder:
            state.recorder.on_request_done(req)
        self.dispatch_queued()

    def release_prefill_copy(self, req: TrackedRequest) -> None:
        """The KV the prefill worker published for `req` is no longer needed: free it there."""
        views = self.state.views
        if req.prefill_worker is not None:
            views[req.prefill_worker].requests.discard(req.request_id)
            if views[req.prefill_worker].gone and req.handle is not None:
                req.handle.unlink()  # its producer is gone: clean up its shared buffer here
            else:
                self.state.send(req.prefill_worker, m.ReleaseKV(req.request_id))
        req.handle = None

    def release_everywhere(self, req: TrackedRequest) -> None:
        """Stop `req` on every worker that holds a copy of it."""
        views = self.state.views
        for wid in {req.prefill_worker, req.decode_worker} - {None}:
            if not views[wid].gone and req.request_id in views[wid].requests:
                self.state.send(wid, m.Abort(req.request_id))
            views[wid].requests.discard(req.request_id)
        if req.handle is not None and views[req.prefill_worker].gone:
            req.handle.unlink()
        req.handle = None


def _run_request(req: TrackedRequest) -> m.RunRequest:
    return m.RunRequest(req.request_id, req.prompt_token_ids, req.params, req.seed, list(req.output_token_ids))
