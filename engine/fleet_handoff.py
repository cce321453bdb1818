"""The controller's side of the KV handoff: send a prefilled request's published KV to a decode
worker with room, follow the acknowledgement, release the prefill copy. Mixed into Fleet."""

import time

from fleetctl.engine import messages as m
from fleetctl.engine.router import WorkerState
from fleetctl.engine.tracked_request import Phase, TrackedRequest
from fleetctl.store.records import WorkerRole


class HandoffRouting:
    def _dispatch_handoffs(self) -> None:
        for _ in range(len(self._pending_handoffs)):
            req = self._pending_handoffs.popleft()
            if req.done or req.handle is None or req.decode_worker is not None:
                continue
            needed = -(-(len(req.prompt_token_ids) + len(req.output_token_ids)) // 16)
            view = self.router.pick_decode_worker(list(self.views.values()), needed)
            if view is None:
                self._pending_handoffs.append(req)
                continue
            view.free_blocks -= needed  # reserved until the worker reports again
            view.requests.add(req.request_id)
            req.decode_worker = view.worker_id
            req.times.handoff_start = req.times.handoff_start or time.time()
            self._send(view.worker_id, m.Adopt(req.request_id, req.prompt_token_ids, list(req.output_token_ids),
                                               req.params, req.seed, req.handle))

    def _on_prefilled(self, wid: str, msg: m.Prefilled) -> None:
        req = self.requests.get(msg.request_id)
        stale = req is None or req.done or req.prompt_worker != wid
        # a restored prefill worker re-publishes its parked sessions; one already on its way to (or
        # at) a decode worker needs no second copy
        if stale or req.phase is not Phase.HANDOFF or req.decode_worker is not None:
            self._transport.release(msg.handle)
            self._send(wid, m.ReleaseKV(msg.request_id))
            return
        req.handle = msg.handle
        req.times.handoff_seconds += msg.publish_seconds
        self._pending_handoffs.append(req)
        self._dispatch_handoffs()

    def _on_adopted(self, wid: str, msg: m.Adopted) -> None:
        req = self.requests.get(msg.request_id)
        self.views[wid].free_blocks = msg.free_blocks
        if req is None or req.done:
            self._send(wid, m.Abort(msg.request_id))
            return
        req.phase = Phase.DECODE
        req.times.handoff_end = time.time()
        req.times.handoff_bytes += msg.nbytes
        req.times.handoff_seconds += msg.seconds
        self.stats.on_handoff(msg.nbytes, msg.seconds)
        self._release_prefill_copy(req)

    def _on_adopt_failed(self, wid: str, msg: m.AdoptFailed) -> None:
        req = self.requests.get(msg.request_id)
        view = self.views[wid]
        view.requests.discard(msg.request_id)
        if req is None or req.done:
            return
        req.decode_worker = None
        if msg.retryable:
            view.free_blocks = 0  # full until it reports again
            self._pending_handoffs.append(req)
        else:
            self._release_prefill_copy(req)
            self._recompute(req, WorkerRole.DECODE)

    def _release_prefill_copy(self, req: TrackedRequest) -> None:
        if req.prompt_worker is not None:
            self.views[req.prompt_worker].requests.discard(req.request_id)
            if self.views[req.prompt_worker].state is WorkerState.FAILED and req.handle is not None:
                self._transport.release(req.handle)  # its producer is gone: clean up its buffer here
            else:
                self._send(req.prompt_worker, m.ReleaseKV(req.request_id))
        req.handle = None

    def _release_everywhere(self, req: TrackedRequest) -> None:
        for wid in {req.prompt_worker, req.decode_worker} - {None}:
            if self.views[wid].state is not WorkerState.FAILED and req.request_id in self.views[wid].requests:
                self._send(wid, m.Abort(req.request_id))
            self.views[wid].requests.discard(req.request_id)
        if req.handle is not None and self.views[req.prompt_worker].state is WorkerState.FAILED:
            self._transport.release(req.handle)
        req.handle = None

