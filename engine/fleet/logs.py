"""The fleet's recent log lines, for `/fleet/logs` and the console's logs view: the controller's own (records
of its `fleetctl` loggers, as source `fleet`) and each worker's, which its process writes — stdout and stderr,
tracebacks included — to a file of its own (`WorkerSpec.log_path`, under `folder`) that the controller reads as
it grows (`poll`: every second, when a worker exits, and before answering). Bounded: the last `keep` lines per
source. A line's level comes from its words; a traceback, and the exception line closing it, are errors. New
worker lines are echoed to the controller's stderr as `[decode-0] …`, so `fleetctl serve` still shows them.
A switched worker's lines follow it to its new id (`rename`); a restarted one appends to the same file."""

import logging
import re
import shutil
import sys
import time
from collections import deque
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import TextIO

from fleetctl.engine.worker.shm_files import pid_alive

KEEP_LINES = 1000  # per source
FLEET = "fleet"  # the controller's own lines
_ERROR = re.compile(r"\b(error|exception|failed|fatal|traceback)\b|^\w*(Error|Exception):", re.IGNORECASE)
_WARNING = re.compile(r"\b(warning|warn|deprecated)\b", re.IGNORECASE)


class LogLevel(StrEnum):
    INFO = "info"
    WARNING = "warning"
    ERROR = "error"


@dataclass(frozen=True)
class LogLine:
    seq: int  # increasing across every source: `since` takes the lines after one
    time: float  # time.time() when the controller read it
    source: str  # "fleet" or a worker id
    level: LogLevel
    text: str


@dataclass
class _Followed:
    """A worker's log file and how far it was read."""

    path: Path
    offset: int = 0
    partial: str = ""  # a line not ended yet
    in_traceback: bool = False


@dataclass
class FleetLogs:
    folder: Path | None  # where workers write their files (None: they write none, e.g. a Ray fleet's)
    keep: int = KEEP_LINES
    echo: TextIO | None = field(default_factory=lambda: sys.stderr)

    def __post_init__(self) -> None:
        self._lines: dict[str, deque[LogLine]] = {}
        self._followed: dict[str, _Followed] = {}
        self._seq = 0

    def path_for(self, worker_id: str) -> Path | None:
        """The file a worker started now writes its output to (its id's, kept across restarts)."""
        if self.folder is None:
            return None
        self.folder.mkdir(parents=True, exist_ok=True)
        return self.folder / f"{worker_id}.log"

    def follow(self, worker_id: str, path: Path) -> None:
        if worker_id not in self._followed or self._followed[worker_id].path != path:
            self._followed[worker_id] = _Followed(path, path.stat().st_size if path.exists() else 0)

    def rename(self, old: str, new: str) -> None:
        """A worker known as `new` from now on (a switch, a migration's standby): its lines and file with it."""
        if old in self._followed:
            self._followed[new] = self._followed.pop(old)
        if old in self._lines:  # after what `new` said before, if anything (a migrated worker's source)
            moved = [LogLine(ln.seq, ln.time, new, ln.level, ln.text) for ln in self._lines.pop(old)]
            merged = sorted([*self._lines.get(new, ()), *moved], key=lambda ln: ln.seq)
            self._lines[new] = deque(merged, maxlen=self.keep)

    def add(self, source: str, level: LogLevel, text: str) -> None:
        self._seq += 1
        self._lines.setdefault(source, deque(maxlen=self.keep)).append(
            LogLine(self._seq, time.time(), source, level, text))

    def poll(self) -> None:
        """Read what each worker's file gained since the last poll."""
        for source, followed in self._followed.items():
            try:
                with followed.path.open("rb") as handle:
                    handle.seek(followed.offset)
                    grown = handle.read()
            except OSError:
                continue
            if not grown:
                continue
            followed.offset += len(grown)
            text = followed.partial + grown.decode("utf-8", errors="replace")
            *complete, followed.partial = text.split("\n")
            for line in complete:
                self._add_worker_line(source, followed, line.rstrip("\r"))

    def _add_worker_line(self, source: str, followed: _Followed, text: str) -> None:
        if text.startswith("Traceback (most recent call last)"):
            followed.in_traceback = True
        if followed.in_traceback:
            level = LogLevel.ERROR
            followed.in_traceback = text[:1] in (" ", "\t") or text.startswith("Traceback")  # its last line ends it
        else:
            level = level_of(text)
        self.add(source, level, text)
        if self.echo is not None:
            self.echo.write(f"[{source}] {text}\n")

    def lines(self, source: str | None = None, since: int = 0, limit: int = 0) -> list[LogLine]:
        """The lines after `since` (a seq), of one source or all, oldest first; the last `limit` of them (0: all)."""
        sources = [self._lines.get(source, ())] if source is not None else list(self._lines.values())
        found = sorted((ln for lines in sources for ln in lines if ln.seq > since), key=lambda ln: ln.seq)
        return found[-limit:] if limit else found

    @property
    def last_seq(self) -> int:
        return self._seq

    def handler(self) -> logging.Handler:
        """A logging handler that keeps the controller's own records here, as source `fleet`."""
        return _RingHandler(self)

    def remove_files(self) -> None:
        if self.folder is not None:
            shutil.rmtree(self.folder, ignore_errors=True)


def sweep_dead_log_folders(root: Path) -> int:
    """Remove the log folders (`fleet-<pid>`) of fleets whose controller is gone (killed: a clean stop removes its
    own); how many."""
    removed = 0
    for folder in root.glob("fleet-*") if root.is_dir() else ():
        pid = folder.name.removeprefix("fleet-")
        if pid.isdigit() and not pid_alive(int(pid)):
            shutil.rmtree(folder, ignore_errors=True)
            removed += 1
    return removed


def level_of(text: str) -> LogLevel:
    if _ERROR.search(text):
        return LogLevel.ERROR
    return LogLevel.WARNING if _WARNING.search(text) else LogLevel.INFO


class _RingHandler(logging.Handler):
    def __init__(self, logs: FleetLogs) -> None:
        super().__init__(logging.INFO)
        self.logs = logs

    def emit(self, record: logging.LogRecord) -> None:
        level = LogLevel.ERROR if record.levelno >= logging.ERROR else \
            LogLevel.WARNING if record.levelno >= logging.WARNING else LogLevel.INFO
        self.logs.add(FLEET, level, record.getMessage())
