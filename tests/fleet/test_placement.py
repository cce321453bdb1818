"""Request placement (`engine/fleet/placement.py`) keeps its two sides in step: under any sequence of the
moves a request makes (placed, prefilled, handed over, adopted, moved live, released, requeued, ended, its
worker renamed), a worker holds a live request only if the request names it, a request's decode worker
holds it, and an ended request is held nowhere."""

import hypothesis.strategies as st
from hypothesis import settings
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from fleetctl.domain import WorkerRole
from fleetctl.engine.core.output import TextStream
from fleetctl.engine.core.sequence import SamplingParams
from fleetctl.engine.fleet import placement
from fleetctl.engine.fleet.request import RequestStage, TrackedRequest
from fleetctl.engine.fleet.worker_view import WorkerView

REQUESTS = 4


def request(n: int) -> TrackedRequest:
    return TrackedRequest(f"req-{n}", [1, 2, 3], SamplingParams(), 0, TextStream.__new__(TextStream))


class Placements(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.views = {wid: WorkerView(wid, role, f"cpu:{i}") for i, (wid, role) in enumerate([
            ("prefill-0", WorkerRole.PREFILL), ("prefill-1", WorkerRole.PREFILL),
            ("decode-0", WorkerRole.DECODE), ("decode-1", WorkerRole.DECODE)])}
        self.reqs = [request(n) for n in range(REQUESTS)]
        self.renames = 0

    def of_role(self, role: WorkerRole) -> list[WorkerView]:
        return sorted((v for v in self.views.values() if v.role is role), key=lambda v: v.worker_id)

    def holders(self, req: TrackedRequest) -> set[str]:
        return {wid for wid, v in self.views.items() if req.request_id in v.requests}

    @rule(n=st.integers(0, REQUESTS - 1), w=st.integers(0, 1))
    def place_prefill(self, n: int, w: int) -> None:
        req = self.reqs[n]
        if req.stage is RequestStage.QUEUED and not self.holders(req):
            placement.place_prefill(req, self.of_role(WorkerRole.PREFILL)[w])

    @rule(n=st.integers(0, REQUESTS - 1), w=st.integers(0, 1))
    def place_decode(self, n: int, w: int) -> None:
        req = self.reqs[n]
        if req.stage is RequestStage.QUEUED and not self.holders(req):
            placement.place_decode(req, self.of_role(WorkerRole.DECODE)[w])

    @rule(n=st.integers(0, REQUESTS - 1))
    def prefilled(self, n: int) -> None:
        req = self.reqs[n]
        if req.stage is RequestStage.PREFILL and req.prefill_worker in self.holders(req):
            placement.prefilled(req)

    @rule(n=st.integers(0, REQUESTS - 1), w=st.integers(0, 1))
    def hand_over(self, n: int, w: int) -> None:
        req = self.reqs[n]
        if req.stage is RequestStage.HANDOFF and req.decode_worker is None:
            placement.hand_over(req, self.of_role(WorkerRole.DECODE)[w])

    @rule(n=st.integers(0, REQUESTS - 1))
    def adopted(self, n: int) -> None:
        req = self.reqs[n]
        if req.stage is RequestStage.HANDOFF and req.decode_worker is not None:
            placement.adopted(req)

    @rule(n=st.integers(0, REQUESTS - 1), w=st.integers(0, 3))
    def release(self, n: int, w: int) -> None:
        req = self.reqs[n]
        view = sorted(self.views.values(), key=lambda v: v.worker_id)[w]
        if not req.done and req.request_id in view.requests:
            placement.release(req, view)

    @rule(n=st.integers(0, REQUESTS - 1))
    def requeue(self, n: int) -> None:
        req = self.reqs[n]
        if not req.done and not self.holders(req):
            placement.requeue(req)

    @rule(n=st.integers(0, REQUESTS - 1))
    def move(self, n: int) -> None:
        req = self.reqs[n]
        if req.stage is RequestStage.DECODE and req.decode_worker is not None:
            dest = next(v for v in self.of_role(WorkerRole.DECODE) if v.worker_id != req.decode_worker)
            placement.move(req, self.views[req.decode_worker], dest)

    @rule(n=st.integers(0, REQUESTS - 1))
    def end(self, n: int) -> None:
        req = self.reqs[n]
        if not req.done:
            for wid in self.holders(req):
                placement.forget(self.views[wid], req.request_id)
            req.stage = RequestStage.DONE

    @rule(w=st.integers(0, 3))
    def rename(self, w: int) -> None:
        old = sorted(self.views)[w]
        new = f"{self.views[old].role.value}-r{self.renames}"
        self.renames += 1
        view = self.views.pop(old)
        view.worker_id = new
        self.views[new] = view
        placement.rename(self.reqs, old, new)

    @invariant()
    def both_sides_agree(self) -> None:
        for req in self.reqs:
            holders = self.holders(req)
            if req.done:
                assert not holders, req.request_id
                continue
            assert holders <= {req.prefill_worker, req.decode_worker}, (req.request_id, holders)
            if req.decode_worker is not None:
                assert req.decode_worker in holders, (req.request_id, req.decode_worker, holders)
            if req.stage is RequestStage.QUEUED:
                assert not holders, (req.request_id, holders)


TestPlacements = Placements.TestCase
TestPlacements.settings = settings(max_examples=200, stateful_step_count=40, deadline=None)
