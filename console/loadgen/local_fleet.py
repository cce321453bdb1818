"""Run `fleetctl serve` as a child process and learn its URL: the fleets `bench --compare-layouts` starts, the
embedded fleet of `fleetctl console` and `fleetctl demo` (cli/embedded.py), the scripts and the tests."""

import os
import re
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from fleetctl.errors import FleetctlError

FLEETCTL = [sys.executable, "-m", "fleetctl.console"]
CPU_DECODE_WORKERS = 2  # on a machine without GPUs: 1 prefill + 2 decode logical cpu slots


class FleetStartError(FleetctlError):
    """The `fleetctl serve` child exited or timed out before it served; the message holds its last output."""

    def __init__(self, output: list[str]) -> None:
        super().__init__("the fleet did not start:\n" + "".join(output[-40:]))
        last = next((line.strip() for line in reversed(output) if line.strip()), "no output")
        self.reason = last.removeprefix("fleetctl: error: ")  # the child's own one-line error, if it gave one


@contextmanager
def local_fleet(model: Path | str, *args: str, ready_timeout: float = 300, env: dict[str, str] | None = None,
                command: list[str] = FLEETCTL) -> Iterator[str]:
    """Yields the base URL of a running fleet (ephemeral port); stops it (SIGTERM, then SIGKILL) after,
    and kills it when the wait for it fails or is interrupted (FleetStartError when it does not start).
    `env` adds to this process's environment (e.g. FLEET_FAULTS for a test); `command` is how fleetctl is
    run (another installation's `bin/fleetctl`, say)."""
    proc = subprocess.Popen([*command, "serve", "--model", str(model), "--port", "0", *args],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env={**os.environ, **(env or {})})
    lines: list[str] = []
    found: list[str] = []
    ready = threading.Event()

    def pump() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append(line)
            if not found and (match := re.search(r"serving \S+ on (http://\S+)", line)):
                found.append(match.group(1))
                ready.set()
        ready.set()

    threading.Thread(target=pump, daemon=True).start()
    try:
        if not ready.wait(ready_timeout) or not found:
            raise FleetStartError(lines)
    except BaseException:  # also Ctrl-C while waiting
        proc.kill()
        proc.wait(10)
        raise
    try:
        yield found[0]
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
