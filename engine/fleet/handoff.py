"""The controller's side of the KV handoff: a prefill worker's first token of a request comes with the KV
it published (`TokenEvent.handoff`, one event: tokens.py streams the token and hands the rest here); send
that KV to a decode worker with room (the one caching most of its conversation, unless overloaded:
router.py), its blocks reserved there until it answers; follow the acknowledgement, release the prefill
copy."""

import time

from fleetctl.domain import WorkerRole, WorkerState
from fleetctl.engine.core.block_allocator import blocks_for
from fleetctl.engine.fleet import placement
from fleetctl.engine.fleet.dispatch import Dispatcher, cached_tokens
from fleetctl.engine.fleet.request import RequestStage, TrackedRequest
from fleetctl.engine.fleet.state import FleetState
from fleetctl.engine.worker import protocol as m


class HandoffRouting:
    def __init__(self, state: FleetState, dispatcher: Dispatcher) -> None:
        self.state = state
        self.dispatcher = dispatcher

    def dispatch(self) -> None:
        """Give every published handoff that has no decode worker yet one with room, if there is one."""
        state = self.state
        for _ in range(len(state.pending_handoffs)):
            req = state.pending_handoffs.popleft()
            if req.done or req.handle is None or req.decode_worker is not None:
                continue
            tokens = len(req.prompt_token_ids) + len(req.output_token_ids)
            view = self.dispatcher.router.pick_decode_worker(self.dispatcher.candidates(req), tokens, req.failed_on,
                                                             cached_tokens(req), req.sibling_decode_workers())
            if view is None:
                self.wait_for_decode(req)
                continue
            view.kv.reserve(req.request_id, blocks_for(tokens, view.kv.block_size))  # until it answers the Adopt
            placement.hand_over(req, view)
            req.times.handoff_start = req.times.handoff_start or time.time()
            state.send(view.worker_id, m.Adopt(req.request_id, req.prompt_token_ids, list(req.output_token_ids),
                                               req.params, req.seed, req.handle, req.session))

    def on_prefill_end(self, req: TrackedRequest, handoff: m.Handoff | None) -> None:
        """Its prefill worker parked `req` with its first token (streamed already): its KV waits for a decode
        worker from now on. Without a handoff, publishing it raised there: the worker's RequestFailed follows,
        and recovery continues it from its tokens."""
        placement.prefilled(req)
        if handoff is not None:
            self._published(req, handoff)

    def on_republished(self, wid: str, msg: m.Republished) -> None:
        """A restored prefill worker published a parked session's KV again; one already on its way to (or at)
        a decode worker needs no second copy."""
        req = self.state.requests.get(msg.request_id)
        stale = req is None or req.done or req.prefill_worker != wid
        if stale or req.stage is not RequestStage.HANDOFF or req.decode_worker is not None:
            msg.handoff.handle.unlink()
            self.state.send(wid, m.ReleaseKV(msg.request_id))
            return
        self._published(req, msg.handoff)

    def _published(self, req: TrackedRequest, handoff: m.Handoff) -> None:
        req.handle = handoff.handle
        req.times.handoff_seconds += handoff.publish_seconds
        self.wait_for_decode(req)
        self.dispatch()

    def wait_for_decode(self, req: TrackedRequest) -> None:
        """`req`'s KV is published and no decode worker holds it: each `dispatch` offers it one."""
        self.state.pending_handoffs.append(req)

    def on_adopted(self, wid: str, msg: m.Adopted) -> None:
        req = self.state.requests.get(msg.request_id)
        self.state.views[wid].kv.settled(msg.request_id, msg.free_blocks)
        if req is None or req.done or req.decode_worker != wid:  # ended, or re-routed off a stopping worker
            self.state.send(wid, m.Abort(msg.request_id))
            return
        placement.adopted(req)
        req.times.handoff_end = time.time()
        req.times.handoff_bytes += msg.nbytes
        req.times.handoff_seconds += msg.seconds
        self.state.stats.on_handoff(msg.nbytes, msg.seconds, msg.cross_node)
        self.state.stats.flow.handoff(req.prefill_worker or "-", wid, msg.nbytes, req.times.handoff_seconds)
        self.dispatcher.release_prefill_copy(req)

    def _kv_removed_by_its_producer(self, req: TrackedRequest) -> bool:
        """A prefill worker stopped on purpose removes the KV it published as it exits, so a handoff that was
        on its way when it stopped cannot be tried again (one that died leaves its shared memory behind)."""
        return req.prefill_worker is not None and self.state.views[req.prefill_worker].state is WorkerState.STOPPED

    def on_adopt_failed(self, wid: str, msg: m.AdoptFailed) -> None:
        req = self.state.requests.get(msg.request_id)
        view = self.state.views[wid]
        if msg.retryable:
            view.kv.refused_for_room(msg.request_id)
        else:
            view.kv.settled(msg.request_id)
        if req is None or req.done or req.decode_worker != wid:
            placement.forget(view, msg.request_id)
            return
        placement.release(req, view)
        if msg.retryable and not self._kv_removed_by_its_producer(req):
            self.wait_for_decode(req)
        else:
            self.dispatcher.release_prefill_copy(req)
            self.dispatcher.recompute(req, WorkerRole.DECODE)
