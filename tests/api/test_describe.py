"""One sentence per operation for people (`schemas.describe`): each kind's result, and an operation that
failed, was called off, or is still running."""

from fleetctl.engine.api.operation_results import (
    CheckpointResult,
    DrainResult,
    LiveMigrateResult,
    MoveResult,
    MoveStageDone,
    RebalancePreview,
    RebalanceResult,
    RestartResult,
    RestoreResult,
    ResumeResult,
    RoleChange,
    RoleChanged,
    StartResult,
    StopResult,
    SwitchResult,
)
from fleetctl.engine.api.operations import OpKind, OpState, describe
from fleetctl.engine.fleet.ops.record import Operation


def said(kind: OpKind, result: object = None, state: OpState = OpState.DONE, error: str | None = None,
         stage: str = "done") -> str:
    op = Operation(kind, "decode-0", state=state, result=result, error=error, stage=stage)  # type: ignore[arg-type]
    return describe(op.info())


def test_each_kind_in_one_sentence() -> None:
    assert said(OpKind.CHECKPOINT, CheckpointResult(
        worker="decode-0", path="/c/d0", checkpoint="/c/d0", sessions=3, bytes=12345, seconds=0.25)) == (
        "decode-0: 3 session(s) saved to /c/d0, 12,345 bytes in 0.250 s")
    assert said(OpKind.MIGRATE, LiveMigrateResult(
        worker="decode-0", from_="cpu:1", to="cpu:2", sessions=3, bytes=12345, downtime_s=0.0042, moves=[],
        seconds=1.0)) == ("decode-0 cpu:1 → cpu:2: live; 3 session(s) moved, 12,345 bytes, longest session "
                          "downtime 4.2 ms")
    assert said(OpKind.RESTORE, RestoreResult(
        kind="restore", worker="decode-0", from_=None, to="cpu:2", mode="cold-start", reason="dtype differs",
        sessions=2, bytes=100, downtime_s=1.5, checkpoint="/c/d0", restore_s=1.0)) == (
        "decode-0 - → cpu:2: cold-start (dtype differs); 2 session(s) moved, 100 bytes, downtime 1.500 s")
    assert said(OpKind.MOVE, MoveResult(
        request="req-1", from_="decode-0", to="decode-1", bytes=2048, downtime_s=None, resumed_at=None,
        stages=[MoveStageDone(stage="reserve", blocks=1, bytes=0, seconds=0.0)] * 3)) == (
        "req-1: decode-0 → decode-1 live in 3 stage(s), 2,048 bytes, downtime -")
    assert said(OpKind.START, StartResult(worker="decode-2", role="decode", device="cpu:3", pid=7, seconds=2.0)) == (
        "decode-2 started on cpu:3 (pid 7) in 2.0 s")
    assert said(OpKind.DRAIN, DrainResult(worker="decode-0", sessions_finished=2, sessions_moved=1, seconds=3.0)) == (
        "decode-0 drained: 2 session(s) finished, 1 moved to peers in 3.0 s; it takes no new work "
        "(`fleetctl resume decode-0` or `fleetctl stop decode-0`)")
    assert said(OpKind.RESUME, ResumeResult(worker="decode-0", cancelled_operation="op-9")) == (
        "decode-0 takes new work again (operation op-9 called off)")
    assert said(OpKind.STOP, StopResult(worker="decode-0", sessions_finished=2, sessions_moved=0, seconds=1.0)) == (
        "decode-0 stopped: 2 session(s) finished, 0 moved to peers, 1.0 s")
    assert said(OpKind.RESTART, RestartResult(worker="decode-0", device="cpu:1", pid=9, attempt=1, backoff_s=0.5)) == (
        "decode-0 restarted on cpu:1 (pid 9), attempt 1 after 0.5 s")
    change = RoleChanged(worker="decode-0", device="cpu:1", from_="decode", to="prefill", sessions=2,
                         new_worker="prefill-1", sessions_finished=1, sessions_moved=1, seconds=4.0)
    assert said(OpKind.REBALANCE, RebalanceResult(split="2:1", from_="1:2", evacuation="move", moves=[change],
                                                  seconds=5.0, via="switch")) == (
        "fleet 1:2 → 2:1: 1 worker(s) changed role (move, via switch); 1 session(s) moved, 1 finished, 5.0 s")
    assert said(OpKind.SWITCH, SwitchResult(worker="prefill-1", was="decode-0", from_="decode", to="prefill", pid=7,
                                            sessions_finished=1, sessions_moved=2, switch_s=0.01,
                                            out_of_service_s=1.5, seconds=1.5)) == (
        "decode-0 is now prefill-1 (decode → prefill, the same process 7): 2 session(s) moved, 1 finished in place; "
        "out of service 1.50 s, of which the switch itself 0.01 s")


def test_operations_that_did_not_finish() -> None:
    assert said(OpKind.MIGRATE, state=OpState.FAILED, error="the new decode-0 process exited") == (
        "migrate of decode-0 failed: the new decode-0 process exited")
    assert said(OpKind.DRAIN, state=OpState.CANCELLED, error="decode-0 was resumed") == (
        "drain of decode-0 called off: decode-0 was resumed")
    assert said(OpKind.DRAIN, state=OpState.RUNNING, stage="draining: 2 session(s) left") == (
        "drain of decode-0: draining: 2 session(s) left")


def test_a_rebalance_preview() -> None:
    preview = RebalancePreview(split="2:1", current="1:2", force=False, evacuation="move", moves=[
        RoleChange(worker="decode-0", device="cpu:1", from_="decode", to="prefill", sessions=2)])
    assert preview.describe() == ("fleet 1:2 → 2:1 (move, via restart): decode-0 on cpu:1: decode → prefill "
                                  "(2 session(s))")
