"""A worker process that dies is reaped at once, even with no restart to follow: no zombie is left in the
process table, and /fleet/workers no longer shows its pid (a stopped one: test_lifecycle_fleet.py)."""

import os
import signal
from pathlib import Path

import httpx
import pytest
from support.fleet_harness import serve, wait_until, worker_pids

pytestmark = pytest.mark.fleet

FLEET = ("--prefill", "1", "--decode", "2", "--devices", "cpu:0,cpu:1,cpu:2", "--dtype", "float32", "--no-restart")


def reaped(pid: int) -> bool:
    """No /proc entry at all (a zombie keeps one, in state Z)."""
    return not Path(f"/proc/{pid}").exists()


def rows(url: str) -> dict[str, dict]:
    return {w["id"]: w for w in httpx.get(f"{url}/fleet/workers", timeout=10).json()["workers"]}


def test_a_killed_worker_leaves_no_zombie_and_no_pid(tiny_model_dir: Path) -> None:
    with serve(tiny_model_dir, *FLEET) as url:
        pids = worker_pids(url)
        os.kill(pids["decode-1"], signal.SIGKILL)  # no restart: nothing else would reap it
        assert wait_until(lambda: rows(url)["decode-1"]["state"] == "failed", 30)
        assert wait_until(lambda: reaped(pids["decode-1"]), 15)
        assert rows(url)["decode-1"]["pid"] is None
        assert rows(url)["decode-0"]["pid"] == pids["decode-0"]  # a running worker's pid is shown
