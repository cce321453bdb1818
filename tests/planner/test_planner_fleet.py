"""The planner against real fleets (worker processes on CPU slots, HTTP, the CLI): the replay's latency for the
split that ran, against what that run measured; `rebalance --apply` (sessions moved live, then forced) while
streams run; `bench --compare-layouts` end to end."""

import asyncio
import json
import random
import subprocess
import time
from pathlib import Path

import pytest
from support.fleet_harness import fleetctl, generate_json, serve, start_streams, wait_until, workers

from fleetctl.console.loadgen.local_fleet import FLEETCTL
from fleetctl.console.loadgen.requests import TraceRequest, prompt_text
from fleetctl.console.loadgen.runner import run_bench
from fleetctl.engine.planner.plan import PlanRequest, plan_from_store
from fleetctl.engine.planner.split import Split
from fleetctl.store.db import open_db

pytestmark = pytest.mark.fleet


def trace(count: int, rate: float, seed: int = 0) -> list[TraceRequest]:
    rng = random.Random(seed)
    clock, requests = 0.0, []
    for _ in range(count):
        words = rng.randint(20, 120)
        requests.append(TraceRequest(prompt_text(rng, words), words, rng.randint(20, 80), clock))
        clock += rng.expovariate(rate)
    return requests


def test_the_replay_predicts_the_measured_latency_of_the_split_that_ran(small_model_dir: Path,
                                                                        tmp_path: Path) -> None:
    """Fitted and replayed over the measured run only: a warm-up run first (a fresh worker's first steps are
    slower while its weights page in), left out of the window."""
    store = tmp_path / "fleet.db"
    with serve(small_model_dir, "--prefill", "1", "--decode", "1", "--devices", "cpu:0,cpu:1", "--dtype", "float32",
               "--store", str(store)) as url:
        asyncio.run(run_bench(url, trace(8, 4.0, seed=1), "warm-up", 30.0, 5.0))
        started = time.time()
        result = asyncio.run(run_bench(url, trace(40, 2.5), "mixed", 30.0, 5.0))
    assert result["errors"] == 0
    now = time.time()
    plan = plan_from_store(store, now - started, PlanRequest(devices="cpu:0,cpu:1"), now=now)
    predicted = plan.candidate(Split(1, 1))
    assert predicted is not None and predicted.requests == 40
    db = open_db(store)
    measured_e2e, measured_ttft = db.execute("SELECT AVG(e2e_s), AVG(ttft_s) FROM requests WHERE ts >= ?",
                                             [started]).fetchone()
    db.close()
    print(f"e2e mean: predicted {predicted.e2e_mean_s:.3f} s, measured {measured_e2e:.3f} s (TTFT mean measured "
          f"{measured_ttft:.3f} s, p90 predicted {predicted.ttft_p90_s:.3f} s); fit {json.dumps(plan.costs.as_json())}")
    assert predicted.e2e_mean_s == pytest.approx(measured_e2e, rel=0.25)


PROMPTS = ["The quick brown fox", "Once upon a time there was", "def add(a, b):", "Numbers 0 1 2 3",
           "Prefill reads the prompt", "decode writes the answer"]
TOKENS = 300
# one sequence per step on each worker: sessions stay on their workers long enough to be moved
FLEET = ("--prefill", "1", "--decode", "2", "--devices", "cpu:0,cpu:1,cpu:2", "--dtype", "float32",
         "--deterministic", "--max-num-seqs", "1")


def test_rebalance_under_live_traffic_loses_no_stream(tiny_model_dir: Path) -> None:
    """Token identity relies on --deterministic: a stream's text must not depend on which worker ran it, on what it
    was batched with, or on being recomputed from its tokens (the forced move)."""
    reference = [r["text"] for r in generate_json(tiny_model_dir, PROMPTS, "--dtype", "float32", "--deterministic",
                                                  "--max-tokens", str(TOKENS), "--ignore-eos")]
    with serve(tiny_model_dir, *FLEET) as url:
        first = start_streams(url, PROMPTS, TOKENS)
        assert wait_until(lambda: all(workers(url)[w]["sessions"] >= 1 for w in ("decode-0", "decode-1")), 60)
        dry = fleetctl("rebalance", "--split", "2:1", "--url", url, "--json")
        assert dry.returncode == 0, dry.stderr
        [planned] = json.loads(dry.stdout)["moves"]
        assert planned["from"] == "decode" and planned["to"] == "prefill"
        applying = subprocess.Popen([*FLEETCTL, "rebalance", "--split", "2:1", "--apply", "--url", url, "--json"],
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        second = start_streams(url, PROMPTS[:3], TOKENS)  # traffic keeps coming while a worker drains
        out, err = applying.communicate(timeout=600)
        assert applying.returncode == 0, err
        result = json.loads(out)
        # the dry run and the apply each pick the decode worker holding fewer sessions at that moment
        assert result["from"] == "1:2" and result["moves"][0]["worker"] in ("decode-0", "decode-1")
        move = result["moves"][0]
        # sessions still running when its drain starts move live to the other decode worker (how many depends on
        # timing: the streams below must come out identical either way)
        assert result["evacuation"] == "move", result
        assert (result["moves"][0]["new_worker"], result["via"]) == ("prefill-1", "switch")
        now = workers(url)
        assert now["prefill-1"]["state"] == "running" and now["prefill-1"]["device"] == move["device"]
        assert move["worker"] not in now and now["prefill-1"]["was"] == move["worker"]  # switched in place

        third = start_streams(url, PROMPTS, TOKENS)
        staying = next(w for w in ("decode-0", "decode-1") if w != move["worker"])
        assert wait_until(lambda: workers(url)[staying]["sessions"] >= 1, 60)
        forced = fleetctl("rebalance", "--split", "1:2", "--apply", "--force", "--url", url, "--json")
        assert forced.returncode == 0, forced.stderr
        assert json.loads(forced.stdout)["evacuation"] == "recompute"
        assert first.result(timeout=600) == reference
        assert second.result(timeout=600) == reference[:3]
        assert third.result(timeout=600) == reference
        assert sorted(w["role"] for w in workers(url).values() if w["state"] == "running") == [
            "decode", "decode", "prefill"]


def test_bench_compares_layouts_on_the_same_devices(tiny_model_dir: Path, tmp_path: Path) -> None:
    path = tmp_path / "short.jsonl"
    path.write_text("".join(json.dumps({"timestamp": 250 * i, "input_length": 20 + 7 * i, "output_length": 12,
                                        "hash_ids": [i % 2]}) + "\n" for i in range(16)))
    result = fleetctl("bench", "--compare-layouts", "--model", str(tiny_model_dir), "--devices", "cpu:0,cpu:1",
                      "--trace", str(path), "--slo-ttft", "5", "--slo-tpot", "1", "--store-dir", str(tmp_path / "runs"),
                      "--json", timeout=600)
    assert result.returncode == 0, result.stderr
    body = json.loads(result.stdout)
    assert body["trace"] == "short.jsonl" and body["split"]["prefill"] == body["split"]["decode"] == 1
    assert body["colocated"]["requests"] == body["disaggregated"]["requests"] == 16
    assert body["colocated"]["errors"] == body["disaggregated"]["errors"] == 0
    assert body["goodput_ratio"] == pytest.approx(body["disaggregated"]["goodput_rps"]
                                                  / body["colocated"]["goodput_rps"], abs=1e-3)
    assert body["plan"]["current"]["layout"] == "colocated" and body["predicted"]["colocated_goodput"] > 0
    replanned = fleetctl("plan", "--store", str(tmp_path / "runs" / "split.db"), "--since", "1h", "--json")
    assert replanned.returncode == 0, replanned.stderr
    assert json.loads(replanned.stdout)["current"] == {"prefill": 1, "decode": 1, "mixed": 0,
                                                         "layout": "disaggregated", "devices": 2}
    text = fleetctl("bench", "--compare-layouts", "--model", str(tiny_model_dir), "--devices", "cpu:0",
                    "--trace", str(path))
    assert text.returncode == 1
    assert text.stderr.strip().startswith("fleetctl: error: no split to compare with: 1 device(s) have no "
                                          "prefill:decode split")
