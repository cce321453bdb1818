"""Run `fleetctl serve` as a child process and learn its URL: used by the bench script, the tests,
and commands that start an embedded fleet."""

import os
import re
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

FLEETCTL = [sys.executable, "-m", "fleetctl.console"]


@contextmanager
def local_fleet(model: Path | str, *args: str, ready_timeout: float = 300,
                env: dict[str, str] | None = None) -> Iterator[str]:
    """Yields the base URL of a running fleet (ephemeral port); stops it (SIGTERM, then SIGKILL) after.
    `env` adds to this process's environment (e.g. FLEET_FAULTS for a test)."""
    proc = subprocess.Popen([*FLEETCTL, "serve", "--model", str(model), "--port", "0", *args],
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
    if not ready.wait(ready_timeout) or not found:
        proc.kill()
        raise RuntimeError("the fleet did not start:\n" + "".join(lines[-40:]))
    try:
        yield found[0]
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
