"""Where requests go and how they end: queued prompts to prefill (or mixed) workers, a request
recomputed from its tokens on a survivor, and the end of a request (finished or failed) with every
copy of it released on the workers."""

import time
from collections import deque

from fleetctl.engine.fleet.request import RequestStage, StreamEvent, TrackedRequest
from fleetctl.engine.fleet.router import WorkerView
from fleetctl.engine.fleet.state import FleetState
from fleetctl.engine.worker import protocol as m
from fleetctl.store.records import WorkerRole


class Dispatcher:
    def __init__(self, state: FleetState) -> None:
        self.state = state

    def dispatch_queued(self) -> None:
        """Send queued prompts to workers with room, in order; a suspect that must wait for its own worker
        does not hold up the queue behind it."""
        state = self.state
        waiting: deque[TrackedRequest] = deque()
        while state.queued:
            req = state.queued.popleft()
            if req.done:
                continue
            view = state.router.pick_prefill_worker(self.candidates(req), state.config.prompt_role,
                                                    near=req.sibling_prefill_workers())
            if view is not None:
                self.run_on(req, view)
                continue
            waiting.append(req)
            if not req.suspect:
                break  # no worker has room
        state.queued.extendleft(reversed(waiting))

    def candidates(self, req: TrackedRequest) -> list[WorkerView]:
        """The workers `req` may go to: any, or for a suspect those computing no other suspect."""
        views = self.state.all_views()
        if not req.suspect:
            return views
        taken = {r.computed_by() for r in self.state.requests.values() if r.suspect and r is not req}
        return [v for v in views if v.worker_id not in taken]

    def run_on(self, req: TrackedRequest, view: WorkerView) -> None:
        """Prefill `req` (prompt and any output so far) on `view`'s worker."""
        req.stage = RequestStage.PREFILL
        req.prefill_worker = view.worker_id
        view.requests.add(req.request_id)
        self.state.send(view.worker_id, _run_request(req))

    def recompute(self, req: TrackedRequest, role: WorkerRole) -> None:
        """Re-run the request from its tokens on a surviving worker of `role` (decode workers prefill
        the tokens themselves), one it has not failed on if there is one."""
        state = self.state
        req.recomputes += 1
        if role is WorkerRole.DECODE:
            view = state.router.pick_decode_worker(self.candidates(req), 0, req.failed_on)
        else:
            view = state.router.pick_prefill_worker(self.candidates(req), role, req.failed_on)
        if view is None:
            if not state.serves(role):
                self.abandon(req, f"no {role.value} worker is left to continue this request")
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

    def fail_stranded(self) -> None:
        """Requests waiting for a role that no worker serves any more, and none is on its way for (see
        FleetState.serves), end now with an error that says so: they would wait forever."""
        state = self.state
        lost = [role for role in state.config.roles if not state.serves(role)]
        if not lost:
            return
        for req in list(state.requests.values()):
            role = next((role for role in lost if role in _needs(req, state.config.colocated)), None)
            if role is not None:
                self.abandon(req, f"no {role.value} worker is left to serve this request")

    def waiting(self) -> int:
        """Requests admitted but not yet generating: queued here, prefilling (or waiting to) on a worker, or
        with their KV waiting for a decode worker. Admission is refused past `max_queue` of them."""
        colocated = self.state.config.colocated
        return sum(1 for r in self.state.requests.values() if r.stage is RequestStage.QUEUED or (
            r.stage in (RequestStage.PREFILL, RequestStage.HANDOFF) and not (colocated and r.output_token_ids)))

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

    def abandon(self, req: TrackedRequest, message: str) -> None:
        """End `req` with an error, releasing every copy of it on the workers."""
        if not req.done:
            self.release_everywhere(req)
            self.fail(req, message)

    def cancel(self, req: TrackedRequest) -> None:
        """The client went away: stop the work wherever it is, queued or held included."""
        if req.done:
            return
        self.release_everywhere(req)
        for waiting in (self.state.queued, self.state.pending_handoffs):
            if req in waiting:
                waiting.remove(req)
        self.finish(req, "abort")

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


def _needs(req: TrackedRequest, colocated: int) -> tuple[WorkerRole, ...]:
    """The roles `req` still needs a worker of (a request a worker holds needs no other)."""
    if colocated:
        return (WorkerRole.MIXED,) if req.stage is RequestStage.QUEUED else ()
    if req.stage is RequestStage.QUEUED:
        return WorkerRole.PREFILL, WorkerRole.DECODE
    return (WorkerRole.DECODE,) if req.stage in (RequestStage.PREFILL, RequestStage.HANDOFF) else ()


def _run_request(req: TrackedRequest) -> m.RunRequest:
    return m.RunRequest(req.request_id, req.prompt_token_ids, req.params, req.seed, list(req.output_token_ids))
