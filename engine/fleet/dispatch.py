"""Where requests go and how they end: queued prompts to prefill or mixed workers — or straight to the
decode worker that caches most of the prompt when what it lacks is short (conditional disaggregation) —,
a request recomputed from its tokens on a survivor, and the end of a request (finished or failed) with
every copy of it released on the workers. A fleet may run prefill, decode and mixed workers at once: a
mixed worker decodes the prompts it takes, and takes handoffs and recomputes like a decode worker."""

import time
from collections import deque

from fleetctl.domain import PHASES, WorkerRole
from fleetctl.engine.core.block_hash import chain_hashes
from fleetctl.engine.core.kv_tiers.presence import TIER_TOKEN_COST, TierPresence
from fleetctl.engine.fleet import placement
from fleetctl.engine.fleet.kv_flow import Arrival
from fleetctl.engine.fleet.request import RequestStage, StreamEvent, TrackedRequest
from fleetctl.engine.fleet.router import CachedTokens, Router
from fleetctl.engine.fleet.state import FleetState
from fleetctl.engine.fleet.worker_view import WorkerView
from fleetctl.engine.worker import protocol as m


class Dispatcher:
    def __init__(self, state: FleetState) -> None:
        self.state = state
        self.router = Router()  # the routing decisions; handoff routing asks it too
        self.tiers = TierPresence.of(state.config.engine)  # the node's KV tiers, when the workers use them

    def dispatch_queued(self) -> None:
        """Send queued prompts to workers with room, in order; a suspect that must wait for its own worker
        does not hold up the queue behind it."""
        state = self.state
        waiting: deque[TrackedRequest] = deque()
        while state.queued:
            req = state.queued.popleft()
            if req.done or self._place(req):
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

    def _place(self, req: TrackedRequest) -> bool:
        """Send a queued request to a worker: the decode worker that caches all but at most
        `local_prefill_tokens` of it, else a prefill or mixed worker. False when none has room."""
        state = self.state
        views, cached, tokens = self.candidates(req), cached_tokens(req, self.tiers), _num_tokens(req)
        threshold = state.config.local_prefill_tokens
        if threshold:  # mixed workers take prompts anyway: the prefill pick weighs their cache
            decoders = [v for v in views if v.role is WorkerRole.DECODE]
            local = self.router.pick_decode_worker(decoders, tokens, cached=cached)
            if local is not None and cached(local) and tokens - cached(local) <= threshold:
                req.local_prefill = True
                state.stats.on_local_prefill()
                self._run_on_decode(req, local, cached)
                return True
        view = self.router.pick_prefill_worker(views, num_tokens=tokens, cached=cached,
                                                near=req.sibling_prefill_workers())
        if view is None:
            return False
        if view.role is WorkerRole.MIXED:
            state.stats.flow.arrived(Arrival.COLOCATED)
        self.run_on(req, view)
        return True

    def run_on(self, req: TrackedRequest, view: WorkerView) -> None:
        """Prefill `req` (prompt and any output so far) on `view`'s worker (a mixed one decodes it too)."""
        placement.place_prefill(req, view)
        self._send_run(req, view, cached_tokens(req, self.tiers))

    def _run_on_decode(self, req: TrackedRequest, view: WorkerView, cached: CachedTokens) -> None:
        """Prefill and decode `req` on decode or mixed worker `view` (a recompute, or a local prefill): no
        handoff."""
        placement.place_decode(req, view)
        self._send_run(req, view, cached)

    def _send_run(self, req: TrackedRequest, view: WorkerView, cached: CachedTokens) -> None:
        view.prefilling[req.request_id] = max(1, round(_num_tokens(req) - cached(view)))
        self.state.send(view.worker_id, _run_request(req))

    def recompute(self, req: TrackedRequest, phase: WorkerRole) -> None:
        """Re-run the request from its tokens on a surviving worker doing `phase`'s work (PREFILL: a prefill
        or mixed worker; DECODE: a decode or mixed worker, which prefills the tokens itself), one it has not
        failed on if there is one."""
        state = self.state
        req.recomputes += 1
        cached = cached_tokens(req, self.tiers)
        if phase is WorkerRole.DECODE:
            view = self.router.pick_decode_worker(self.candidates(req), 0, req.failed_on, cached)
        else:
            view = self.router.pick_prefill_worker(self.candidates(req), req.failed_on, _num_tokens(req), cached)
        if view is None:
            if not state.serves(phase):
                why = state.lost_nodes_note(phase)
                self.abandon(req, f"no {state.phase_workers(phase)} worker is left to continue this request{why}")
            else:
                placement.requeue(req)
                state.queued.appendleft(req)
            return
        on_decode = phase is WorkerRole.DECODE and view.role is WorkerRole.DECODE
        state.stats.flow.arrived(Arrival.DECODE_RECOMPUTE if on_decode else Arrival.RECOMPUTE)
        if phase is not WorkerRole.DECODE:
            self.run_on(req, view)
            return
        self._run_on_decode(req, view, cached)

    def fail_stranded(self) -> None:
        """Requests waiting for a phase that no worker serves any more, and none is on its way for (see
        FleetState.serves), end now with an error that says so: they would wait forever."""
        state = self.state
        lost = [phase for phase in PHASES if not state.serves(phase)]
        if not lost:
            return
        for req in list(state.requests.values()):
            phase = next((phase for phase in lost if phase in self._needs(req)), None)
            if phase is not None:
                self.abandon(req, f"no {state.phase_workers(phase)} worker is left to serve this "
                                  f"request{state.lost_nodes_note(phase)}")

    def waiting(self) -> int:
        """Requests admitted but not yet generating: queued here, prefilling (or waiting to) on a worker, or
        with their KV waiting for a decode worker. Admission is refused past `max_queue` of them."""
        return sum(1 for r in self.state.requests.values() if r.stage in (RequestStage.QUEUED, RequestStage.HANDOFF)
                   or (r.stage is RequestStage.PREFILL and not (r.output_token_ids and self._prefilled_by_decoder(r))))

    def _needs(self, req: TrackedRequest) -> tuple[WorkerRole, ...]:
        """The phases `req` still needs a worker for (a request a worker decodes needs no other)."""
        if req.stage is RequestStage.QUEUED:
            return PHASES
        if req.stage is RequestStage.HANDOFF or (req.stage is RequestStage.PREFILL
                                                 and not self._prefilled_by_decoder(req)):
            return (WorkerRole.DECODE,)
        return ()

    def _prefilled_by_decoder(self, req: TrackedRequest) -> bool:
        """Its prefill runs on a worker that decodes it there too (a mixed one, or one its session moved to
        from a mixed one)."""
        view = self.state.views.get(req.prefill_worker or "")
        return view is not None and view.role.covers(WorkerRole.DECODE)

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
        if state.tracer:
            state.tracer.on_request_done(req)
        self.dispatch_queued()

    def release_prefill_copy(self, req: TrackedRequest) -> None:
        """The KV the prefill worker published for `req` is no longer needed: free it there."""
        views = self.state.views
        if req.prefill_worker is not None:
            placement.release(req, views[req.prefill_worker])
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
            placement.forget(views[wid], req.request_id)
        if req.handle is not None and views[req.prefill_worker].gone:
            req.handle.unlink()
        req.handle = None


def cached_tokens(req: TrackedRequest, tiers: TierPresence | None = None) -> CachedTokens:
    """How many leading tokens of `req` (prompt and output so far) a worker caches, by its last digest; with
    `tiers` (the node's KV tiers, which its workers read back from), the blocks after those that a tier holds
    count too, each token at 1 − TIER_TOKEN_COST: cheaper than a recompute, dearer than a pool hit. The hash
    chain is computed once per salt root and extended as the request grows; a worker on another node (Ray)
    reads other tiers, so only its pool counts."""
    tokens = req.prompt_token_ids + req.output_token_ids
    in_tiers: dict[tuple[bytes, int], int] = {}  # (root, blocks its pool holds) -> blocks the tiers hold after

    def cached(view: WorkerView) -> float:
        index = view.prefix
        local_tiers = tiers if not view.node else None
        if index.hashes is None or (not index.hashes and local_tiers is None):
            return 0
        key = (index.root, index.block_size)
        chain = req.prefix_chains[key] = chain_hashes(index.root, tokens, index.block_size,
                                                      req.prefix_chains.get(key, ()))
        pooled = index.cached_blocks(chain)
        if local_tiers is None:
            return pooled * index.block_size
        if (index.root, pooled) not in in_tiers:  # the prompt's last token is always computed: not its block
            readable = chain[: (len(tokens) - 1) // index.block_size]
            in_tiers[index.root, pooled] = local_tiers.leading_blocks(readable, pooled)
        return (pooled + (1 - TIER_TOKEN_COST) * in_tiers[index.root, pooled]) * index.block_size

    return cached


def _num_tokens(req: TrackedRequest) -> int:
    return len(req.prompt_token_ids) + len(req.output_token_ids)


def _run_request(req: TrackedRequest) -> m.RunRequest:
    return m.RunRequest(req.request_id, req.prompt_token_ids, req.params, req.seed, list(req.output_token_ids),
                        req.session)
