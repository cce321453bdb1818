"""The controller's failure handling: a worker that died (or whose hold expired) has its sessions
recomputed from their tokens on a surviving worker of the same role. Mixed into Fleet."""

import logging

from fleetctl.engine import messages as m
from fleetctl.engine.router import Router, WorkerState
from fleetctl.engine.tracked_request import Phase, TrackedRequest
from fleetctl.store.records import WorkerRole

log = logging.getLogger(__name__)


class FleetRecovery:
    def _on_worker_exit(self, wid: str) -> None:
        view = self.views[wid]
        if view.state in (WorkerState.FAILED, WorkerState.STOPPED):
            return
        if view.state is WorkerState.CHECKPOINTED:  # stood down on purpose: its sessions are held
            self._drop_published_kv(wid)
            return
        was_running = view.state is WorkerState.RUNNING
        view.state = WorkerState.STOPPED if self._stopping else WorkerState.FAILED
        if self.recorder and was_running:
            self.recorder.worker_stopped(view, view.state, {"requests": len(view.requests)})
        if self._stopping:
            return
        log.warning("worker %s died; recomputing its %d request(s)", wid, len(view.requests))
        self.stats.on_failure(view.role)
        self.recompute_held(wid)

    def _drop_published_kv(self, wid: str) -> None:
        """A stood-down prefill worker removed its published KV: its handoffs wait for a re-publish
        after restore (or a recompute when the hold expires)."""
        for req in self.requests.values():
            if req.prompt_worker == wid and req.phase is Phase.HANDOFF and req.decode_worker is None:
                req.handle = None

    def recompute_held(self, wid: str) -> None:
        """Continue every request `wid` holds on a surviving worker of the same role, from its tokens."""
        view = self.views[wid]
        for rid in list(view.requests):
            req = self.requests.get(rid)
            view.requests.discard(rid)
            if req is None or req.done:
                continue
            if req.decode_worker == wid:  # decoding here, or its handoff was on the way here
                req.decode_worker = None
                if req.phase is Phase.HANDOFF and req.handle is not None:
                    self._pending_handoffs.append(req)
                else:
                    self._recompute(req, WorkerRole.DECODE)
            elif req.prompt_worker == wid and req.phase is Phase.PREFILL:
                self._recompute(req, view.role)
            elif req.prompt_worker == wid and req.handle is not None and req.handle.kind != "shm":
                self._recompute(req, WorkerRole.DECODE)  # device memory died with its producer
            # a shm handle outlives its producer: the pending handoff proceeds
        self._dispatch_handoffs()
        self._dispatch_queued()

    def _recompute(self, req: TrackedRequest, role: WorkerRole) -> None:
        """Re-run the request from its tokens on a surviving worker of `role`."""
        req.recomputes += 1
        if role is WorkerRole.DECODE:
            view = self.router.pick_decode_worker(list(self.views.values()), 0)
        else:
            view = self.router.pick_prompt_worker(list(self.views.values()), role)
        if view is None:
            if not Router.has_role(list(self.views.values()), role):
                self._fail(req, f"no {role.value} worker is left to continue this request")
            else:
                req.phase = Phase.QUEUED
                self._queued.appendleft(req)
            return
        if role is WorkerRole.DECODE:
            req.phase, req.decode_worker = Phase.DECODE, view.worker_id
            view.requests.add(req.request_id)
            self._send(view.worker_id, m.RunRequest(req.request_id, req.prompt_token_ids, req.params, req.seed,
                                                    list(req.output_token_ids)))
        else:
            self._run_on(req, view)

