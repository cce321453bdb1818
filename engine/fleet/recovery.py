"""The controller's failure handling for requests: a worker that died (or was killed as hung, or whose hold
expired) has its sessions continued from their tokens on a surviving worker of the same role, and a request
a worker could not serve (it raised on it) is retried on another one. A request that has failed on more
workers than `Supervision.max_retries` is failed as poisoned: it is never passed on forever.

Only a request that was being computed counts a failure: a handoff parked on a prefill worker that died
did not take it down (and its KV in shared memory survives it). A worker that raised on a request named
it; one that died did not, so every request it was computing becomes a *suspect*: suspects are kept apart
(Dispatcher.candidates) until each has come through a step elsewhere, so a poisoned request that keeps
killing workers fails alone and the innocents it was batched with the first time go on."""

import logging

from fleetctl.domain import WorkerRole, WorkerState
from fleetctl.engine.fleet import placement
from fleetctl.engine.fleet.dispatch import Dispatcher
from fleetctl.engine.fleet.handoff import HandoffRouting
from fleetctl.engine.fleet.request import RequestStage, TrackedRequest
from fleetctl.engine.fleet.state import FleetState
from fleetctl.engine.worker import protocol as m

log = logging.getLogger(__name__)


class Recovery:
    def __init__(self, state: FleetState, dispatcher: Dispatcher, handoffs: HandoffRouting) -> None:
        self.state = state
        self.dispatcher = dispatcher
        self.handoffs = handoffs

    def on_worker_exit(self, wid: str) -> bool:
        """The current process of `wid` exited. True when it died (failed, not stopped or stood down on
        purpose, and not while starting): its sessions are then the caller's to recompute."""
        state = self.state
        view = state.views[wid]
        if view.state in (WorkerState.FAILED, WorkerState.STOPPED):
            return False
        if view.state is WorkerState.CHECKPOINTED:  # stood down on purpose: its sessions are held
            self._drop_published_kv(wid)
            return False
        was_running = view.state in (WorkerState.RUNNING, WorkerState.DRAINING)
        was_starting = view.state is WorkerState.STARTING
        view.state = WorkerState.STOPPED if state.stopping else WorkerState.FAILED
        if state.recorder and was_running:
            details = {"requests": len(view.requests)} | ({"reason": view.last_error} if view.last_error else {})
            state.recorder.worker_stopped(view, view.state, details)
        if state.stopping or was_starting:  # a worker that never started holds nothing; start() reports it
            return False
        log.warning("worker %s died%s; recomputing its %d request(s)", wid,
                    f" ({view.last_error})" if view.last_error else "", len(view.requests))
        state.stats.on_failure(view.role)
        return True

    def _drop_published_kv(self, wid: str) -> None:
        """A stood-down prefill worker removed its published KV: its handoffs wait for a re-publish
        after restore (or a recompute when the hold expires)."""
        for req in self.state.requests.values():
            if req.prefill_worker == wid and req.stage is RequestStage.HANDOFF and req.decode_worker is None:
                req.handle = None

    def on_request_failed(self, wid: str, msg: m.RequestFailed) -> None:
        """`wid` dropped a request: invalid (its client gets the message), or it raised there (retried)."""
        req = self.state.requests.get(msg.request_id)
        placement.forget(self.state.views[wid], msg.request_id)  # it dropped it
        if req is None or req.done or not _held_by(req, wid):
            return  # a stale copy: the request lives elsewhere now
        if not msg.retry:
            self.dispatcher.abandon(req, msg.message)
        elif self._count_failure(req, wid, f"{wid}: {msg.message}"):
            self._continue(req, wid, kv_kept=True)
        self.handoffs.dispatch()
        self.dispatcher.dispatch_queued()

    def recompute_held(self, wid: str, kv_kept: bool = True, failed: bool = False) -> None:
        """Continue every request `wid` holds on a surviving worker of the same role, from its tokens.
        `kv_kept`: the KV it published to shared memory outlives it (a process that died; one shut down
        on purpose removes its buffers as it exits). `failed`: it died or hung (each request it was
        computing counts a failure)."""
        view = self.state.views[wid]
        for rid in list(view.requests):
            req = self.state.requests.get(rid)
            placement.forget(view, rid)  # it holds nothing more; what goes on elsewhere is released in _continue
            if req is None or req.done:
                continue
            if failed and req.computed_by() == wid:
                req.suspect = True  # the culprit, or an innocent batch-mate: kept apart from other suspects
                if not self._count_failure(req, wid, f"{wid} died serving it"):
                    continue
            self._continue(req, wid, kv_kept)
        self.handoffs.dispatch()
        self.dispatcher.dispatch_queued()

    def _count_failure(self, req: TrackedRequest, wid: str, why: str) -> bool:
        """One more worker failed on `req`; False when that makes it poisoned (and it has been failed)."""
        req.failures += 1
        req.failed_on.add(wid)
        if req.failures <= self.state.config.supervision.max_retries:
            return True
        log.warning("request %s failed %d times; failing it as poisoned", req.request_id, req.failures)
        self.dispatcher.abandon(req, f"request {req.request_id} failed {req.failures} times, on "
                                     f"{', '.join(sorted(req.failed_on))} (last: {why}); it is treated as poisoned "
                                     f"and not retried")
        return False

    def _continue(self, req: TrackedRequest, wid: str, kv_kept: bool) -> None:
        """`wid` no longer holds `req`: send it where it can go on."""
        role = self.state.views[wid].role
        if req.decode_worker == wid:  # decoding here, or its handoff was on the way here
            placement.release(req, self.state.views[wid])
            if req.stage is RequestStage.HANDOFF and req.handle is not None:
                self.handoffs.wait_for_decode(req)
            else:
                self.dispatcher.recompute(req, WorkerRole.DECODE)
        elif req.prefill_worker == wid and req.stage is RequestStage.PREFILL:
            # prefilled there: on a decode worker it decoded there too (a session moved from a mixed one)
            self.dispatcher.recompute(req, WorkerRole.DECODE if role is WorkerRole.DECODE else WorkerRole.PREFILL)
        elif req.prefill_worker == wid and req.handle is not None and not req.handle.outlives_producer:
            self.dispatcher.recompute(req, WorkerRole.DECODE)  # device memory died with its producer
        elif req.prefill_worker == wid and req.decode_worker is None and not (kv_kept and req.handle):
            # its KV was never published (a stood-down worker dropped it, publishing failed) or goes with the
            # process
            req.handle = None
            self.dispatcher.recompute(req, WorkerRole.DECODE)
        # otherwise a shm handle outlives its producer: the pending (or arriving) handoff proceeds


def _held_by(req: TrackedRequest, wid: str) -> bool:
    """`wid` has the request: computing it, or (prefill) holding its KV for a handoff not yet on its way."""
    return req.computed_by() == wid or (req.prefill_worker == wid and req.stage is RequestStage.HANDOFF
                                        and req.decode_worker is None)
