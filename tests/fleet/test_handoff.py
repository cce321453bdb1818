"""The controller's handoff routing without processes: what a decode worker's refusal of a handoff does,
depending on whether the KV it refused still exists."""

from pathlib import Path

import pytest

from fleetctl.domain import WorkerRole, WorkerState
from fleetctl.engine.core.sequence import SamplingParams
from fleetctl.engine.fleet.dispatch import Dispatcher
from fleetctl.engine.fleet.fleet_config import FleetConfig
from fleetctl.engine.fleet.handoff import HandoffRouting
from fleetctl.engine.fleet.request import RequestStage, TrackedRequest
from fleetctl.engine.fleet.state import FleetState
from fleetctl.engine.fleet.stats import FleetStats
from fleetctl.engine.fleet.worker_kv import WorkerKV
from fleetctl.engine.fleet.worker_view import WorkerView
from fleetctl.engine.worker import protocol as m


class RecordingLink:
    def __init__(self) -> None:
        self.sent: list[object] = []

    def send(self, msg: object) -> None:
        self.sent.append(msg)


def handoff_in_flight(tmp_path: Path, prefill_state: WorkerState) -> tuple[FleetState, TrackedRequest, Path]:
    """prefill-0 (in `prefill_state`) published a request's KV to shared memory and the controller sent it to
    decode-0, which has no free block left."""
    buffer = tmp_path / "req-1.kv"
    buffer.write_bytes(b"kv")
    views = {"prefill-0": WorkerView("prefill-0", WorkerRole.PREFILL, "cpu:0", state=prefill_state),
             "decode-0": WorkerView("decode-0", WorkerRole.DECODE, "cpu:1", state=WorkerState.RUNNING,
                                    kv=WorkerKV(4, free=0), requests={"req-1"})}
    state = FleetState(FleetConfig(tmp_path, shm_dir=tmp_path), {}, views, FleetStats(), None,
                       links={"prefill-0": RecordingLink(), "decode-0": RecordingLink()})
    req = TrackedRequest("req-1", [5, 6, 7], SamplingParams(max_tokens=4), seed=0, stream=None,
                         stage=RequestStage.HANDOFF, prefill_worker="prefill-0", decode_worker="decode-0",
                         handle=m.KVHandle("req-1", m.HandleKind.SHM, (1,), "float32", 2, str(buffer)))
    state.requests[req.request_id] = req
    return state, req, buffer


@pytest.mark.parametrize("prefill_state", [WorkerState.RUNNING, WorkerState.FAILED])
def test_a_handoff_refused_for_room_waits_for_room_while_its_kv_exists(tmp_path: Path,
                                                                       prefill_state: WorkerState) -> None:
    state, req, buffer = handoff_in_flight(tmp_path, prefill_state)  # a worker that died leaves its KV behind
    HandoffRouting(state, Dispatcher(state)).on_adopt_failed("decode-0", m.AdoptFailed("req-1", "full", True))
    assert list(state.pending_handoffs) == [req] and req.handle is not None and buffer.exists()
    assert req.decode_worker is None and req.stage is RequestStage.HANDOFF


def test_a_handoff_refused_for_room_after_its_prefill_worker_stopped_is_recomputed(tmp_path: Path) -> None:
    """Force-stopping a prefill worker while one of its handoffs is on its way: the worker removes the KV as it
    exits, so waiting for room to adopt it again would only fail later; the request is recomputed."""
    state, req, buffer = handoff_in_flight(tmp_path, WorkerState.STOPPED)
    HandoffRouting(state, Dispatcher(state)).on_adopt_failed("decode-0", m.AdoptFailed("req-1", "full", True))
    assert not state.pending_handoffs and req.handle is None and not buffer.exists()
    assert req.recomputes == 1 and req.decode_worker == "decode-0"  # it prefills the tokens itself
    assert [type(msg) for msg in state.links["decode-0"].sent] == [m.RunRequest]
