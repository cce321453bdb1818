"""The controller's log ring without processes: a worker's file read as it grows (a line split across two
reads kept whole), levels from words and tracebacks, a bound per source, `since`, the controller's own records,
and a renamed worker's lines following it; the folders of fleets that were killed are swept."""

import io
import logging
import os
from pathlib import Path

from fleetctl.engine.fleet.logs import FLEET, FleetLogs, LogLevel, sweep_dead_log_folders


def test_a_workers_file_is_read_as_it_grows_with_levels(tmp_path: Path) -> None:
    echo = io.StringIO()
    logs = FleetLogs(tmp_path, echo=echo)
    path = logs.path_for("decode-0")
    path.write_text("old run's line\n")
    logs.follow("decode-0", path)  # from where the file is now: an earlier process's lines are not news
    with path.open("a") as out:
        out.write("loading weights\nUserWarning: TypedStorage is deprecated\nTraceback (most recent call last):\n"
                  '  File "loop.py", line 3, in step\nRuntimeError: out of memory\nserving ag')
    logs.poll()
    with path.open("a") as out:
        out.write("ain\n")
    logs.poll()
    lines = logs.lines("decode-0")
    assert [(ln.level, ln.text) for ln in lines] == [
        (LogLevel.INFO, "loading weights"), (LogLevel.WARNING, "UserWarning: TypedStorage is deprecated"),
        (LogLevel.ERROR, "Traceback (most recent call last):"), (LogLevel.ERROR, '  File "loop.py", line 3, in step'),
        (LogLevel.ERROR, "RuntimeError: out of memory"), (LogLevel.INFO, "serving again")]
    assert echo.getvalue().splitlines()[0] == "[decode-0] loading weights"
    assert [ln.text for ln in logs.lines(since=lines[3].seq)] == ["RuntimeError: out of memory", "serving again"]


def test_bounded_per_source_and_the_controllers_own_records(tmp_path: Path) -> None:
    logs = FleetLogs(None, keep=3, echo=None)
    for n in range(5):
        logs.add("decode-0", LogLevel.INFO, f"line {n}")
    record = logging.LogRecord("fleetctl.x", logging.WARNING, __file__, 1, "decode-%d failed", (1,), None)
    logs.handler().emit(record)
    assert [ln.text for ln in logs.lines("decode-0")] == ["line 2", "line 3", "line 4"]
    [fleet] = logs.lines(FLEET)
    assert (fleet.level, fleet.text) == (LogLevel.WARNING, "decode-1 failed")
    assert [ln.source for ln in logs.lines(limit=2)] == ["decode-0", FLEET]
    assert logs.path_for("decode-0") is None


def test_a_renamed_worker_keeps_its_lines_and_file(tmp_path: Path) -> None:
    logs = FleetLogs(tmp_path, echo=None)
    path = logs.path_for("decode-1")
    logs.follow("decode-1", path)
    logs.add("prefill-2", LogLevel.INFO, "the id's earlier worker")
    path.write_text("before the switch\n")
    logs.poll()
    logs.rename("decode-1", "prefill-2")
    with path.open("a") as out:
        out.write("after the switch\n")
    logs.poll()
    assert [ln.text for ln in logs.lines("prefill-2")] == [
        "the id's earlier worker", "before the switch", "after the switch"]
    assert logs.lines("decode-1") == []


def test_the_log_folders_of_fleets_that_were_killed_are_swept(tmp_path: Path) -> None:
    (tmp_path / "fleet-999999999").mkdir()  # no such process
    (tmp_path / f"fleet-{os.getpid()}").mkdir()  # this one lives
    (tmp_path / "notes").mkdir()
    assert sweep_dead_log_folders(tmp_path) == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == [f"fleet-{os.getpid()}", "notes"]
