"""The operation runner tells expected failures from bugs: a FleetError (or CheckpointError, TimeoutError)
fails the operation with its message and logs nothing; anything else — a RuntimeError included, as asyncio
raises — fails it as an internal error and reaches `log.exception` with its traceback."""

import asyncio
import logging
from types import SimpleNamespace

import pytest

from fleetctl.engine.api.operation_results import ResumeResult
from fleetctl.engine.api.operations import OpKind, OpState
from fleetctl.engine.checkpoint.format import CheckpointError
from fleetctl.engine.fleet.errors import OperationCancelled, OperationFailed
from fleetctl.engine.fleet.ops.moves_in_flight import MovesInFlight
from fleetctl.engine.fleet.ops.record import Operation
from fleetctl.engine.fleet.ops.runner import OperationRunner


def run(error: BaseException | None) -> Operation:
    async def scenario() -> Operation:
        host = SimpleNamespace(routing_changed=lambda: None)
        runner = OperationRunner(SimpleNamespace(arriving={}), host, MovesInFlight())  # type: ignore[arg-type]

        async def work() -> ResumeResult:
            if error is not None:
                raise error
            return ResumeResult(worker="decode-0", cancelled_operation=None)

        op = runner.launch(Operation(OpKind.RESUME, "decode-0"), work())
        while op.state is OpState.RUNNING:
            await asyncio.sleep(0)
        assert runner.busy_with("decode-0") is None
        return op

    return asyncio.run(scenario())


@pytest.mark.parametrize("error", [OperationFailed("the new decode-0 process exited"), CheckpointError("bad sha256"),
                                   TimeoutError("timed out")])
def test_an_expected_failure_fails_the_operation_with_its_message(error: Exception,
                                                                   caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.ERROR):
        op = run(error)
    assert (op.state, op.error) == (OpState.FAILED, str(error))
    assert not caplog.records


def test_a_bug_is_logged_with_its_traceback_and_fails_as_an_internal_error(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.ERROR):
        op = run(RuntimeError("Event loop is closed"))
    assert op.state is OpState.FAILED and op.error == "internal error: RuntimeError('Event loop is closed')"
    [record] = caplog.records
    assert record.exc_info is not None and record.exc_info[0] is RuntimeError


def test_done_and_called_off() -> None:
    done = run(None)
    assert (done.state, done.step, done.stage) == (OpState.DONE, "done", "done")
    assert done.result == ResumeResult(worker="decode-0", cancelled_operation=None)
    cancelled = run(OperationCancelled("decode-0 was resumed"))
    assert (cancelled.state, cancelled.error) == (OpState.CANCELLED, "decode-0 was resumed")
