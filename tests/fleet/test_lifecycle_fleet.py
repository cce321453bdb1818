"""`fleetctl start`, `drain`, `resume` and `stop` on a real fleet (worker processes on CPU slots, HTTP, the
CLI) while streams run. Token identity relies on `--deterministic`: a stream's text must not depend on
which decode worker ran it or on what it was batched with."""

import json
import subprocess
from pathlib import Path

import httpx
import pytest
from support.fleet_harness import fleetctl, generate_json, serve, start_streams, wait_until, workers

from fleetctl.console.loadgen.local_fleet import FLEETCTL

pytestmark = pytest.mark.fleet  # real worker processes and a real server

PROMPTS = ["The quick brown fox", "Once upon a time there was", "def add(a, b):", "Numbers 0 1 2 3",
           "Prefill reads the prompt", "decode writes the answer"]
TOKENS = 300
# one sequence per step on each worker: a worker holding two sessions holds them for 2 x TOKENS steps
FLEET = ("--prefill", "1", "--decode", "2", "--devices", "cpu:0,cpu:1,cpu:2", "--dtype", "float32",
         "--deterministic", "--max-num-seqs", "1")


def cli_json(*args: str) -> dict:
    result = fleetctl(*args, "--json")
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def gone(pid: int) -> bool:
    """Exited and reaped: no /proc entry at all (a zombie keeps one, in state Z)."""
    return not Path(f"/proc/{pid}").exists()


def test_start_drain_resume_stop_via_the_cli_lose_no_stream(tiny_model_dir: Path) -> None:
    reference = [r["text"] for r in generate_json(tiny_model_dir, PROMPTS, "--dtype", "float32", "--deterministic",
                                                  "--max-tokens", str(TOKENS), "--ignore-eos")]
    with serve(tiny_model_dir, *FLEET) as url:
        first = start_streams(url, PROMPTS[:2], TOKENS)
        assert wait_until(lambda: sum(w["sessions"] for w in workers(url).values()) >= 1, 60)
        started = cli_json("start", "--role", "decode", "--device", "cpu:3", "--url", url)
        assert {k: started[k] for k in ("worker", "role", "device")} == {"worker": "decode-2", "role": "decode",
                                                                          "device": "cpu:3"}
        assert workers(url)["decode-2"]["state"] == "running" and workers(url)["decode-2"]["pid"] == started["pid"]

        second = start_streams(url, PROMPTS, TOKENS)
        assert wait_until(lambda: all(workers(url)[w]["sessions"] >= 1 for w in ("decode-0", "decode-1")), 60)
        stopped_pid = workers(url)["decode-1"]["pid"]
        drain = subprocess.Popen([*FLEETCTL, "drain", "decode-0", "--url", url, "--json"], stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE, text=True)
        stop = cli_json("stop", "decode-1", "--url", url)
        out, err = drain.communicate(timeout=600)
        assert drain.returncode == 0, err
        drained = json.loads(out)
        assert drained["worker"] == "decode-0" and drained["sessions_finished"] >= 1
        assert stop["worker"] == "decode-1" and stop["sessions_finished"] >= 1 and stop["sessions_moved"] == 0

        assert first.result(timeout=600) == reference[:2]
        assert second.result(timeout=600) == reference
        now = workers(url)
        assert (now["decode-0"]["state"], now["decode-0"]["sessions"]) == ("draining", 0)
        assert now["decode-1"]["state"] == "stopped" and wait_until(lambda: gone(stopped_pid), 10)
        assert now["decode-1"]["pid"] is None

        assert cli_json("resume", "decode-0", "--url", url) == {"worker": "decode-0", "cancelled_operation": None}
        assert workers(url)["decode-0"]["state"] == "running"
        again = fleetctl("stop", "decode-1", "--url", url)
        assert again.returncode == 1
        assert again.stderr.strip() == ("fleetctl: error: POST /fleet/workers/decode-1/stop: HTTP 409: decode-1 is "
                                        "stopped, not running")
        ok = httpx.post(f"{url}/v1/completions", json={"model": "tiny-llama0", "prompt": "hi", "max_tokens": 3},
                        timeout=60)
        assert ok.status_code == 200
