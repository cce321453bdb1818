"""Helpers for integration tests against a real `fleetctl serve` process on 127.0.0.1."""

import json
import os
import subprocess
import time
from pathlib import Path

import httpx

from fleetctl.console.local_fleet import FLEETCTL
from fleetctl.console.local_fleet import local_fleet as serve

__all__ = ["admin", "fleetctl", "generate_json", "serve", "wait_until", "worker_pids"]


def admin() -> dict[str, str]:
    """The header calls that change a fleet need (the token `serve` wrote under this test run's $FLEET_HOME)."""
    from fleetctl.engine.server.admin_auth import read_admin_token

    return {"Authorization": f"Bearer {read_admin_token()}"}


def fleetctl(*args: str, env: dict | None = None, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([*FLEETCTL, *args], capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, **(env or {})})


def generate_json(model: Path, prompts: list[str], *extra: str) -> list[dict]:
    """`fleetctl generate --json` for the prompts (one batch), parsed."""
    result = fleetctl("generate", "--model", str(model), "--json", *extra, *prompts)
    assert result.returncode == 0, result.stderr
    return [json.loads(line) for line in result.stdout.splitlines()]


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
