"""The controller SIGKILLed under load (the kill-under-load chaos run, short): its workers notice and exit by
themselves, the metrics store it was writing passes SQLite's integrity check, and a new `serve` on the same
$FLEET_HOME serves, sweeping the handoff buffers the dead fleet left."""

import os
import signal
from pathlib import Path

import httpx
import openai
import pytest
from support.fleet_harness import serve, start_streams, wait_until

from fleetctl.engine.worker.shm_files import SHM_DIR, SHM_PREFIX
from fleetctl.store.db import open_db

pytestmark = pytest.mark.fleet

PROMPTS = ["The quick brown fox", "Once upon a time there was", "def add(a, b):", "Numbers 0 1 2 3"] * 2


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as stat:
        return stat.read().split(") ", 1)[1][0] != "Z"  # a zombie has exited


def leftovers(fleet_pid: int) -> list[str]:
    """The handoff buffers of the fleet whose controller was `fleet_pid`."""
    return [p.name for p in SHM_DIR.glob(f"{SHM_PREFIX}{fleet_pid}-*")]


def test_a_controller_killed_under_load_leaves_nothing_running_and_a_sound_store(small_model_dir: Path,
                                                                                 fleet_home: Path) -> None:
    fleet = ("--prefill", "1", "--decode", "1", "--devices", "cpu:0,cpu:1", "--heartbeat-timeout", "4")
    with serve(small_model_dir, *fleet) as url:
        status = httpx.get(f"{url}/fleet/status", timeout=10).json()
        controller, workers = status["pid"], [w["pid"] for w in status["workers"]]
        streams = start_streams(url, PROMPTS, 400, small_model_dir.name)
        assert wait_until(lambda: sum(w["sessions"] for w in httpx.get(
            f"{url}/fleet/workers", timeout=10).json()["workers"]) >= len(PROMPTS) // 2, 60)
        os.kill(controller, signal.SIGKILL)
        with pytest.raises(openai.APIConnectionError):  # the streams' connections simply break
            streams.result(timeout=60)
        assert wait_until(lambda: not any(alive(pid) for pid in workers), 20), "a worker outlived its controller"
    db = open_db(fleet_home / "fleet.db")
    assert db.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    assert db["requests"].count >= 0 and db["workers"].count >= 2
    db.close()
    with serve(small_model_dir, *fleet) as url:
        done = httpx.post(f"{url}/v1/completions", json={"model": small_model_dir.name, "prompt": "hi",
                                                          "max_tokens": 4}, timeout=60)
        assert done.status_code == 200
        assert wait_until(lambda: leftovers(controller) == [], 10), leftovers(controller)
