"""Starts a real `fleetctl serve` process on 127.0.0.1 with an ephemeral port, for integration tests."""

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx

FLEETCTL = [sys.executable, "-m", "fleetctl.console"]


def fleetctl(*args: str, env: dict | None = None, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([*FLEETCTL, *args], capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, **(env or {})})


def generate_json(model: Path, prompts: list[str], *extra: str) -> list[dict]:
    """`fleetctl generate --json` for the prompts (one batch), parsed."""
    result = fleetctl("generate", "--model", str(model), "--json", *extra, *prompts)
    assert result.returncode == 0, result.stderr
    return [json.loads(line) for line in result.stdout.splitlines()]


@contextmanager
def serve(model: Path, *args: str, ready_timeout: float = 240) -> Iterator[str]:
    """Yields the base URL of a running fleet; stops it (SIGTERM, then SIGKILL) afterwards."""
    proc = subprocess.Popen([*FLEETCTL, "serve", "--model", str(model), "--port", "0", *args],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
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
        raise RuntimeError("fleet did not start:\n" + "".join(lines[-40:]))
    try:
        yield found[0]
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)


def worker_pids(url: str) -> dict[str, int]:
    workers = httpx.get(f"{url}/fleet/workers", timeout=10).json()["workers"]
    return {w["id"]: w["pid"] for w in workers}


def wait_until(predicate, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return False
