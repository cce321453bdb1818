"""The controller's failure handling: a worker that died (or whose hold expired) has its sessions
recomputed from their tokens on a surviving worker of the same role."""

import logging

from fleetctl.engine.fleet.dispatch import Dispatcher
from fleetctl.engine.fleet.handoff import HandoffRouting
from fleetctl.engine.fleet.request import RequestStage
from fleetctl.engine.fleet.state import FleetState
from fleetctl.store.records import WorkerRole, WorkerState

log = logging.getLogger(__name__)


class Recovery:
    def __init__(self, state: FleetState, dispatcher: Dispatcher, handoffs: HandoffRouting) -> None:
        self.state = state
        self.dispatcher = dispatcher
        self.handoffs = handoffs

    def on_worker_exit(self, wid: str) -> None:
        state = self.state
        view = state.views[wid]
        if view.state in (WorkerState.FAILED, WorkerState.STOPPED):
            return
        if view.state is WorkerState.CHECKPOINTED:  # stood down on purpose: its sessions are held
            self._drop_published_kv(wid)
            return
        was_running = view.state in (WorkerState.RUNNING, WorkerState.DRAINING)
        was_starting = view.state is WorkerState.STARTING
        view.state = WorkerState.STOPPED if state.stopping else WorkerState.FAILED
        if state.recorder and was_running:
            state.recorder.worker_stopped(view, view.state, {"requests": len(view.requests)})
        if state.stopping or was_starting:  # a worker that never started holds nothing; start() reports it
            return
        log.warning("worker %s died; recomputing its %d request(s)", wid, len(view.requests))
        state.stats.on_failure(view.role)
        self.recompute_held(wid)

    def _drop_published_kv(self, wid: str) -> None:
        """A stood-down prefill worker removed its published KV: its handoffs wait for a re-publish
        after restore (or a recompute when the hold expires)."""
        for req in self.state.requests.values():
            if req.prefill_worker == wid and req.stage is RequestStage.HANDOFF and req.decode_worker is None:
                req.handle = None

    def recompute_held(self, wid: str, kv_kept: bool = True) -> None:
        """Continue every request `wid` holds on a surviving worker of the same role, from its tokens.
        `kv_kept`: the KV it published to shared memory outlives it (a process that died; one shut down
        on purpose removes its buffers as it exits)."""
        view = self.state.views[wid]
        for rid in list(view.requests):
            req = self.state.requests.get(rid)
            view.requests.discard(rid)
            if req is None or req.done:
                continue
            if req.decode_worker == wid:  # decoding here, or its handoff was on the way here
                req.decode_worker = None
                if req.stage is RequestStage.HANDOFF and req.handle is not None:
                    self.state.pending_handoffs.append(req)
                else:
                    self.dispatcher.recompute(req, WorkerRole.DECODE)
            elif req.prefill_worker == wid and req.stage is RequestStage.PREFILL:
                self.dispatcher.recompute(req, view.role)
            elif req.prefill_worker == wid and req.handle is not None and not req.handle.outlives_producer:
                self.dispatcher.recompute(req, WorkerRole.DECODE)  # device memory died with its producer
            elif req.prefill_worker == wid and req.decode_worker is None and not (kv_kept and req.handle):
                # its KV was never published (a stood-down worker dropped it) or goes with the process
                req.handle = None
                self.dispatcher.recompute(req, WorkerRole.DECODE)
            # otherwise a shm handle outlives its producer: the pending (or arriving) handoff proceeds
        self.handoffs.dispatch()
        self.dispatcher.dispatch_queued()
