"""Timing how fleetctl quits: a process and everything it started, watched until none of it runs and no handoff
buffer of theirs is left in shared memory; and `fleetctl console` on a pseudo-terminal (a real terminal's
driver), for keys such as `q`. The tests of quitting and scripts/quit_times.py share these."""

import os
import pty
import select
import subprocess
import time
from collections.abc import Sequence

import psutil

from fleetctl.console.loadgen.local_fleet import FLEETCTL
from fleetctl.engine.worker.shm_files import SHM_DIR, buffers


def process_tree(pid: int) -> list[psutil.Process]:
    """The process and all its descendants now."""
    root = psutil.Process(pid)
    return [root, *root.children(recursive=True)]


def running(processes: Sequence[psutil.Process]) -> list[psutil.Process]:
    alive = []
    for process in processes:
        try:
            if process.is_running() and process.status() != psutil.STATUS_ZOMBIE:
                alive.append(process)
        except psutil.NoSuchProcess:
            pass
    return alive


def left_behind(processes: Sequence[psutil.Process]) -> list[str]:
    """What of `processes` still runs, and the handoff buffers any of them (as a fleet) left, as text."""
    pids = {process.pid for process in processes}
    return ([line for p in running(processes) if (line := _described(p))]
            + [str(b.path) for b in buffers(SHM_DIR) if b.fleet_pid in pids])


def _described(process: psutil.Process) -> str | None:
    """`process` as a line, or None when it ended since it was seen running (a zombie has no command line)."""
    try:
        return f"pid {process.pid}: {' '.join(process.cmdline()[-4:])}"
    except (psutil.NoSuchProcess, psutil.ZombieProcess):
        return None


def seconds_until_all_gone(processes: Sequence[psutil.Process], since: float, timeout: float,
                           poll=lambda: None) -> float:
    """Seconds from `since` (time.monotonic) until nothing of `processes` runs and no buffer of theirs is left;
    `poll` runs meanwhile (draining a terminal, reaping a child). AssertionError, naming what is left, after
    `timeout`."""
    while left := left_behind(processes):
        assert time.monotonic() - since < timeout, f"still there {timeout:g} s later: {left}"
        poll()
        time.sleep(0.02)
    return time.monotonic() - since


class TerminalConsole:
    """`fleetctl console *args` on a pseudo-terminal of 160 × 48, its own session (as from a shell)."""

    def __init__(self, *args: str, env: dict[str, str] | None = None) -> None:
        self._controller, terminal = pty.openpty()
        os.set_blocking(self._controller, False)
        env = {**os.environ, "COLUMNS": "160", "LINES": "48", "TERM": "xterm-256color", **(env or {})}
        self.process = subprocess.Popen([*FLEETCTL, "console", *args], stdin=terminal, stdout=terminal,
                                        stderr=terminal, env=env, start_new_session=True)
        os.close(terminal)
        self.screen = b""

    def drain(self) -> None:
        """Read what the console drew (a terminal that is not read blocks the console's writes)."""
        self.process.poll()
        while select.select([self._controller], [], [], 0)[0]:
            try:
                chunk = os.read(self._controller, 1 << 16)
            except OSError:  # the console closed its end
                return
            if not chunk:
                return
            self.screen += chunk

    def wait_for(self, text: bytes, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while text not in self.screen:
            assert time.monotonic() < deadline and self.process.poll() is None, self.screen[-1500:]
            time.sleep(0.05)
            self.drain()

    def press(self, key: bytes) -> None:
        os.write(self._controller, key)

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait(10)
        os.close(self._controller)
