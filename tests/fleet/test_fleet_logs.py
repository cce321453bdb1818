"""The fleet's log lines on a real fleet (`/fleet/logs`): a worker's own output — the traceback and the line it
prints when a request fails on it — is read from the file its process writes, with its level; it is still there
once that worker was killed; the controller's own lines are there under `fleet`; `since` gives only newer lines;
an unknown worker is a 404."""

import os
import signal
from pathlib import Path

import httpx
import pytest
from support.fleet_harness import serve, wait_until, worker_pids, workers

pytestmark = [pytest.mark.fleet, pytest.mark.slow]
FLEET = ("--prefill", "1", "--decode", "1", "--devices", "cpu:0,cpu:1", "--dtype", "float32", "--no-restart")
POISON = {"FLEET_FAULTS": "step@poison=raise:boom", "FLEET_DEBUG": "1"}


def logs(url: str, **params: object) -> httpx.Response:
    return httpx.get(f"{url}/fleet/logs", params=params, timeout=10)


def test_a_workers_last_words_are_kept_after_it_is_killed(tiny_model_dir: Path) -> None:
    with serve(tiny_model_dir, *FLEET, env=POISON) as url:
        first = logs(url).json()
        assert any(line["source"] == "fleet" for line in first["lines"])  # the controller's own (its start)
        body = {"model": tiny_model_dir.name, "prompt": "hello there", "max_tokens": 4, "temperature": 0}
        failed = httpx.post(f"{url}/v1/completions", headers={"X-Request-Id": "poison-1"}, json=body, timeout=60)
        assert failed.status_code >= 400  # the step raised on every try

        def said() -> list[dict]:
            return logs(url, worker="prefill-0").json()["lines"]

        assert wait_until(lambda: any("request poison-1 failed: InjectedFault: boom" in ln["text"] for ln in said()))
        lines = said()
        traceback = next(ln for ln in lines if ln["text"].startswith("Traceback"))
        assert traceback["level"] == "error" and {ln["source"] for ln in lines} == {"prefill-0"}
        assert any(ln["level"] == "error" and ln["text"].endswith("faults.InjectedFault: boom") for ln in lines)

        os.kill(worker_pids(url)["prefill-0"], signal.SIGKILL)
        assert wait_until(lambda: workers(url)["prefill-0"]["state"] == "failed", timeout=30)
        assert any("request poison-1 failed" in ln["text"] for ln in said())  # its last words, kept

        newer = logs(url, since=first["next"]).json()
        assert newer["lines"] and all(ln["seq"] > first["next"] for ln in newer["lines"])
        assert newer["next"] >= max(ln["seq"] for ln in newer["lines"])
        assert logs(url, worker="decode-9").status_code == 404
