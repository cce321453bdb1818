"""The CLI and the console say every operation's outcome in the same sentence (`schemas.describe`): for each kind
(and each path of one: a live migration and one through a checkpoint, drain and drain --move) a real result model
is the end of an operation the fixture fleet runs through its stages; the line `fleetctl` prints for it and the
line the console's progress dialog leaves on screen are compared. A failure reads the same on both too."""

import asyncio
import contextlib
import math
import time

import pytest
from support.console_fixture import FixtureSource, operation, pilot_until
from textual.geometry import Size
from textual.widgets import Label

from fleetctl.console.cli.common import operation_output
from fleetctl.console.console_settings import ConsoleSettings
from fleetctl.console.tui.app import FleetConsole
from fleetctl.console.tui.screens import dialogs
from fleetctl.console.tui.screens.dialogs import OperationDialog
from fleetctl.engine.api.operation_results import (
    CheckpointResult,
    DrainResult,
    LiveMigrateResult,
    MoveResult,
    MoveStageDone,
    OperationResult,
    RebalanceResult,
    RestartResult,
    RestoreResult,
    ResumeResult,
    RoleChanged,
    SessionMoved,
    StartResult,
    StopResult,
)
from fleetctl.engine.api.operations import OperationInfo, OpKind, OpState, describe
from fleetctl.errors import FleetctlError

CKPT = "/home/op/.local/share/fleetctl/checkpoints/decode-1-20261201T204500Z"
OUTCOMES: dict[str, tuple[OpKind, str, OperationResult]] = {  # test id -> (kind, worker, result)
    "checkpoint": (OpKind.CHECKPOINT, "decode-1", CheckpointResult(
        worker="decode-1", path=CKPT, checkpoint=CKPT, sessions=4, bytes=12_582_912, seconds=0.214)),
    "restore": (OpKind.RESTORE, "decode-1", RestoreResult(
        worker="decode-1", from_="cpu:2", to="cpu:4", mode="restored", reason=None, sessions=4, bytes=12_582_912,
        downtime_s=1.82, checkpoint=CKPT, restore_s=1.1)),
    "restore-cold-start": (OpKind.RESTORE, "decode-1", RestoreResult(
        worker="decode-1", from_=None, to="cpu:4", mode="cold-start", reason="torch: checkpoint has '2.12'",
        sessions=4, bytes=0, downtime_s=3.4, checkpoint=CKPT, restore_s=3.0)),
    "migrate-live": (OpKind.MIGRATE, "decode-0", LiveMigrateResult(
        worker="decode-0", from_="cpu:2", to="cpu:5", sessions=2, bytes=2_097_152, downtime_s=0.0041, seconds=1.3,
        moves=[SessionMoved(request="req-1", downtime_s=0.0041, resumed_at=10.0),
               SessionMoved(request="req-2", downtime_s=0.0032, resumed_at=10.1)])),
    "migrate-via-checkpoint": (OpKind.MIGRATE, "prefill-0", RestoreResult(
        kind="migrate", worker="prefill-0", from_="cpu:0", to="cpu:6", mode="restored", reason=None, sessions=1,
        bytes=1_048_576, downtime_s=0.93, checkpoint=CKPT, restore_s=0.5, checkpoint_s=0.31)),
    "move": (OpKind.MOVE, "decode-0", MoveResult(
        request="req-9", from_="decode-0", to="decode-1", bytes=786_432, downtime_s=0.0021, resumed_at=11.0,
        stages=[MoveStageDone(stage="pre-copy", blocks=11, bytes=720_896, seconds=0.02),
                MoveStageDone(stage="final stage", blocks=1, bytes=65_536, seconds=0.002)])),
    "start": (OpKind.START, "decode-2", StartResult(worker="decode-2", role="decode", device="cpu:3", pid=4321,
                                                   seconds=4.2)),
    "drain": (OpKind.DRAIN, "decode-2", DrainResult(worker="decode-2", sessions_finished=3, seconds=12.5)),
    "drain-move": (OpKind.DRAIN, "decode-2", DrainResult(worker="decode-2", sessions_finished=1, seconds=0.8,
                                                        sessions_moved=5)),
    "resume": (OpKind.RESUME, "decode-2", ResumeResult(worker="decode-2", cancelled_operation="op-3f2a")),
    "stop": (OpKind.STOP, "decode-2", StopResult(worker="decode-2", sessions_finished=2, sessions_moved=1,
                                                 seconds=3.3)),
    "restart": (OpKind.RESTART, "decode-1", RestartResult(worker="decode-1", device="cpu:2", pid=4555, attempt=2,
                                                          backoff_s=2.0)),
    "rebalance": (OpKind.REBALANCE, "fleet", RebalanceResult(
        split="2:1", from_="1:2", evacuation="move", seconds=7.4,
        moves=[RoleChanged(worker="decode-0", device="cpu:1", from_="decode", to="prefill", sessions=3,
                           new_worker="prefill-1", sessions_finished=0, sessions_moved=3, seconds=7.3)])),
}


@pytest.fixture(autouse=True)
def quick_polls(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(dialogs, "POLL_S", 0.01)


def dialog_line(source: FixtureSource, first: OperationInfo) -> tuple[OperationInfo, str]:
    """Follow `first` in the console's progress dialog to its end: the last state it read and its result line."""
    ended, shown, _ = dialog_result(source, first)
    return ended, shown


def dialog_result(source: FixtureSource, first: OperationInfo) -> tuple[OperationInfo, str, Size]:
    """As `dialog_line`, and the size the result's label takes on screen."""
    async def run() -> tuple[OperationInfo, str, Size]:
        app = FleetConsole(source, ConsoleSettings(), refresh=False)
        async with app.run_test(size=(120, 40)) as pilot:
            dialog = OperationDialog(source, first)
            await app.push_screen(dialog)
            for _ in range(300):
                await pilot.pause(0.02)
                if dialog.operation.state is not OpState.RUNNING:
                    break
            await pilot.pause(0.05)
            label = dialog.query_one("#op-result", Label)
            return dialog.operation, str(label.render()).removesuffix("\n(enter to close)"), label.size

    return asyncio.run(run())


@pytest.mark.parametrize("outcome", OUTCOMES)
def test_the_cli_and_the_console_say_a_result_in_one_sentence(outcome: str) -> None:
    kind, worker, result = OUTCOMES[outcome]
    source = FixtureSource(results={kind: result})
    ended, shown = dialog_line(source, source.begin(kind, worker))
    assert ended.state is OpState.DONE and ended.result == result and source._polls >= 1
    printed = operation_output(ended, as_json=False, timeout=60)
    assert printed == shown
    assert "\n" not in printed and printed == result.describe()


def test_a_long_result_wraps_inside_the_dialog_rather_than_being_cut() -> None:
    kind, worker, result = OUTCOMES["migrate-live"]
    source = FixtureSource(results={kind: result})
    _, shown, size = dialog_result(source, source.begin(kind, worker))
    assert len(shown) > size.width  # the sentence is wider than the dialog: it must take more than one line
    assert size.height >= math.ceil(len(shown) / size.width) + 1  # its lines, and "(enter to close)"


def test_a_failure_reads_the_same_on_both() -> None:
    """The CLI's one error line is the message of what `operation_output` raises (`Commands` prints it)."""
    failed = operation(OpKind.MIGRATE, "decode-0", None, error="cpu:5 is held by decode-1")
    _, shown = dialog_line(FixtureSource(), failed)
    with pytest.raises(FleetctlError) as raised:
        operation_output(failed, as_json=False, timeout=60)
    assert str(raised.value) == shown
    assert shown == "migrate of decode-0 failed: cpu:5 is held by decode-1"


def test_a_failure_that_names_its_operation_is_not_named_twice() -> None:
    """A checkpoint's writer failing says "checkpoint of W failed: …" (so a migration through it reads right)."""
    error = "checkpoint of decode-0 failed: no room for the checkpoint in /ckpt: it needs 9.0 MiB"
    assert describe(operation(OpKind.CHECKPOINT, "decode-0", None, error=error)) == error
    assert describe(operation(OpKind.MIGRATE, "decode-0", None, error=error)) == f"migrate of decode-0 failed: {error}"


class LatePolls(FixtureSource):
    """A fleet whose answer to a poll arrives even though the poll was cancelled (the HTTP stack can finish a
    request it was asked to drop): the dialog it was for is gone by then."""

    in_flight = False
    answered_late = False

    async def operation(self, op_id: str) -> OperationInfo:
        self.in_flight = True
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            ignored_until = time.monotonic() + 0.2  # every cancel is ignored: the answer comes once the dialog is gone
            while time.monotonic() < ignored_until:
                with contextlib.suppress(asyncio.CancelledError):
                    await asyncio.sleep(0.02)
            self.answered_late = True
        return await super().operation(op_id)


def test_a_poll_answered_after_the_dialog_closed_does_not_crash_the_console() -> None:
    kind, worker, result = OUTCOMES["drain"]
    source = LatePolls(results={kind: result})

    async def run() -> bool:
        app = FleetConsole(source, ConsoleSettings(), refresh=False)
        async with app.run_test(size=(120, 40)) as pilot:
            await app.push_screen(OperationDialog(source, source.begin(kind, worker)))
            await pilot_until(pilot, lambda: source.in_flight)
            await pilot.press("enter")
            await pilot_until(pilot, lambda: source.answered_late)
            await pilot.pause(0.1)
            return isinstance(app.screen, OperationDialog)

    assert asyncio.run(run()) is False
