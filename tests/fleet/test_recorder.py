"""A fleet run with traffic leaves rows in the metrics store, and the per-phase numbers say what
each pool did (tiny model, real worker processes, real server)."""

import json
import sqlite3
from pathlib import Path

import httpx
import pytest
from support.fleet_harness import fleetctl, serve

from fleetctl.store.db import open_db

pytestmark = pytest.mark.fleet  # real worker processes and a real server

PROMPT_HEAVY = ["The quick brown fox jumps over the lazy dog. " * 25 + str(i) for i in range(4)]  # ~250 tokens
OUTPUT_HEAVY = [f"hi {i}" for i in range(4)]  # short prompts, 150 new tokens


def _complete(url: str, prompt: str, max_tokens: int) -> None:
    body = {"model": "tiny-llama0", "prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True}
    assert httpx.post(f"{url}/v1/completions", json=body, timeout=120).status_code == 200


def test_traffic_fills_the_store_and_classify_sees_the_phases(tiny_model_dir: Path, tmp_path: Path) -> None:
    store = tmp_path / "fleet.db"
    # no local prefills (conditional disaggregation): each phase on its own worker, as the checks below read
    with serve(tiny_model_dir, "--prefill", "1", "--decode", "1", "--devices", "cpu:0,cpu:1", "--dtype",
               "float32", "--kv-blocks", "128", "--store", str(store), "--local-prefill-tokens", "0") as url:
        for prompt in PROMPT_HEAVY:
            _complete(url, prompt, 2)
        for prompt in OUTPUT_HEAVY:
            _complete(url, prompt, 150)
        status = httpx.get(f"{url}/fleet/status", timeout=10).json()
        assert status["pools"]["decode"]["mbu"] > 0 and status["pools"]["decode"]["mfu"] > 0
    db = sqlite3.connect(store)
    counts = {t: db.execute(f"select count(*) from {t}").fetchone()[0]
              for t in ("devices", "workers", "worker_samples", "requests", "events")}
    assert all(counts.values()), counts
    assert counts["requests"] == len(PROMPT_HEAVY) + len(OUTPUT_HEAVY)
    per_worker = dict(db.execute("select worker_id, sum(prefill_tokens) || ',' || sum(decode_tokens) "
                                 "from worker_samples group by worker_id").fetchall())
    prefill_tokens, prefill_decode = map(int, per_worker["prefill-0"].split(","))
    decode_prefill, decode_tokens = map(int, per_worker["decode-0"].split(","))
    assert prefill_tokens > 0 and prefill_decode == 0
    assert decode_tokens > 0 and decode_prefill == 0
    kinds = {k for (k,) in db.execute("select kind from events")}
    assert {"start", "stop"} <= kinds
    peaks = db.execute("select peak_flops, peak_bytes_per_s from devices").fetchall()
    assert all(f > 0 and b > 0 for f, b in peaks)

    result = fleetctl("classify", "--since", "1h", "--store", str(store), "--json")
    assert result.returncode == 0, result.stderr
    classified = json.loads(result.stdout)
    assert classified["requests"] == counts["requests"]
    assert abs(classified["prefill_share"] + classified["decode_share"] - 1) < 1e-9
    buckets = {(b["prompt_tokens"], b["output_tokens"]): b["prefill_share"] for b in classified["buckets"]
               if b["requests"]}
    prompt_heavy = buckets[("128-512", "0-128")]
    output_heavy = buckets[("0-128", "128-512")]
    assert prompt_heavy > 0.5 > output_heavy


def test_classify_without_a_store_fails_clearly(tmp_path: Path) -> None:
    result = fleetctl("classify", "--store", str(tmp_path / "missing.db"))
    assert result.returncode != 0 and "no metrics store" in result.stderr
    store = tmp_path / "fleet.db"
    open_db(store).close()
    bad_window = fleetctl("classify", "--since", "ten minutes", "--store", str(store))
    assert bad_window.returncode != 0 and "bad --since" in bad_window.stderr
    assert fleetctl("classify", "--since", "10m", "--store", str(store)).returncode == 0
