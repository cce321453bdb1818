"""Prefix caching across a real fleet (worker processes on CPU slots, HTTP, the store): a conversation's
turns. A short new suffix is prefilled by the decode worker holding the conversation (no handoff); a
long one goes through the prefill pool, whose cache serves the earlier turns, and back to the same
decode worker. Token identity with a cache-off engine relies on `--deterministic`: batch-invariant
numerics make K/V read from a cached block the same bits as K/V computed in this step."""

import json
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from support.fleet_harness import fleetctl, serve, wait_until

from fleetctl.engine.core.engine_settings import EngineConfig, EngineSettings
from fleetctl.engine.core.llm_engine import LLMEngine
from fleetctl.engine.core.sequence import SamplingParams

pytestmark = pytest.mark.fleet  # real worker processes and a real server

OUTPUT = 12
LOCAL = 64  # --local-prefill-tokens
FLEET = ("--prefill", "1", "--decode", "2", "--devices", "cpu:0,cpu:1,cpu:2", "--dtype", "float32",
         "--deterministic", "--local-prefill-tokens", str(LOCAL))


def ids(n: int, salt: int) -> list[int]:
    return [(7 * i + 13 * salt) % 300 + 3 for i in range(n)]


def complete(url: str, prompt: list[int]) -> str:
    body = {"model": "tiny-llama0", "prompt": prompt, "max_tokens": OUTPUT, "temperature": 0, "ignore_eos": True}
    response = httpx.post(f"{url}/v1/completions", json=body, timeout=120)
    assert response.status_code == 200, response.text
    return response.json()["choices"][0]["text"]


def all_blocks_free(url: str) -> bool:
    """Every worker's blocks are free or merely cached (no sequence holds one)."""
    workers = httpx.get(f"{url}/fleet/workers", timeout=10).json()["workers"]
    return all(w["free_blocks"] == w["kv_blocks"] for w in workers)


def abort_midway(url: str, prompt: list[int]) -> None:
    """A streamed turn (a local prefill: its conversation is cached) whose client leaves after a few tokens."""
    body = {"model": "tiny-llama0", "prompt": prompt, "max_tokens": 150, "temperature": 0, "ignore_eos": True,
            "stream": True}
    with httpx.stream("POST", f"{url}/v1/completions", json=body, timeout=120) as response:
        assert response.status_code == 200
        chunks = 0
        for line in response.iter_lines():
            chunks += line.startswith("data: ")
            if chunks == 3:
                break


def requests_by_order(url: str) -> list[dict]:
    return httpx.get(f"{url}/fleet/requests", timeout=10).json()["requests"]


def metric(url: str, name: str) -> dict[tuple, float]:
    text = httpx.get(f"{url}/metrics", timeout=10).text
    return {tuple(sorted(s.labels.items())): s.value for f in text_string_to_metric_families(text)
            for s in f.samples if s.name == name}


def test_turns_of_a_conversation_reuse_its_cache_locally_or_through_the_prefill_pool(tiny_model_dir: Path,
                                                                                    tmp_path: Path) -> None:
    turn1 = ids(150, 1)
    store = tmp_path / "fleet.db"
    with serve(tiny_model_dir, *FLEET, "--store", str(store)) as url:
        answer1 = complete(url, turn1)
        tokenize = httpx.post(f"{url}/tokenize", json={"prompt": answer1}, timeout=10).json()["tokens"]
        turn2 = turn1 + tokenize + ids(20, 2)  # a short tool result: the decode worker prefills it
        text2 = complete(url, turn2)
        turn3 = turn2 + ids(120, 3)  # a long one: the prefill pool, then back to the same decode worker
        text3 = complete(url, turn3)
        assert wait_until(lambda: all_blocks_free(url), 10)  # no reference left after handoffs and local prefills
        turn4 = turn3 + ids(30, 4)
        abort_midway(url, turn4)
        assert wait_until(lambda: all_blocks_free(url), 10)  # nor after a client went away mid-stream
        assert wait_until(lambda: len(requests_by_order(url)) == 4, 10)
        first, second, third, aborted = requests_by_order(url)
        status = httpx.get(f"{url}/fleet/status", timeout=10).json()
        hit_ratio = metric(url, "fleet_prefix_cache_hit_ratio")
        local_total = metric(url, "fleet_local_prefills_total")

    assert first["prefill_worker"] == "prefill-0" and not first["local_prefill"]
    assert first["prefill_cached_tokens"] == 0 and first["prefill_computed_tokens"] == len(turn1)
    home = first["decode_worker"]

    assert second["local_prefill"] and second["decode_worker"] == home and second["prefill_worker"] is None
    assert second["handoff_bytes"] == 0
    assert second["prefill_cached_tokens"] >= 144  # turn 1's 9 full prompt blocks at least
    assert second["prefill_computed_tokens"] == len(turn2) - second["prefill_cached_tokens"] <= LOCAL

    assert not third["local_prefill"] and third["prefill_worker"] == "prefill-0" and third["handoff_bytes"] > 0
    assert third["decode_worker"] == home  # the decode worker holding the conversation takes it back
    assert third["prefill_cached_tokens"] == 144  # the prefill worker cached turn 1's prompt only
    assert third["prefill_computed_tokens"] == len(turn3) - 144

    reference = LLMEngine(EngineConfig(tiny_model_dir, settings=EngineSettings(
        dtype="float32", deterministic=True, prefix_cache=False)))
    greedy = SamplingParams(max_tokens=OUTPUT, temperature=0.0, ignore_eos=True)
    assert [r.text for r in reference.generate([turn1, turn2, turn3], greedy)] == [answer1, text2, text3]

    assert aborted["outcome"] == "abort" and aborted["local_prefill"] and aborted["decode_worker"] == home
    assert status["local_prefills"] == 2 and local_total[()] == 2
    assert status["pools"]["decode"]["prefix_hit_ratio"] > 0.5 and status["pools"]["prefill"]["prefix_hit_ratio"] > 0
    worker = {w["id"]: w for w in status["workers"]}[home]
    assert hit_ratio[(("role", "decode"), ("worker", home))] == pytest.approx(worker["prefix_hit_ratio"], abs=1e-4)

    assert wait_until(lambda: store.exists(), 10)
    result = fleetctl("classify", "--store", str(store), "--json")
    assert result.returncode == 0, result.stderr
    classified = json.loads(result.stdout)
    assert classified["requests"] == 4 and classified["local_prefills"] == 2
    cached = sum(r["prefill_cached_tokens"] for r in (second, third, aborted))
    assert classified["prefill_cached_tokens"] == cached
    assert classified["prefill_computed_tokens"] == len(turn1) + len(turn2) + len(turn3) + len(turn4) - cached


def test_bench_replays_a_session_trace_whose_later_turns_hit_the_cache(tiny_model_dir: Path, tmp_path: Path) -> None:
    trace = tmp_path / "sessions.jsonl"
    turns = [{"session_id": s, "turn": t, "prompt_tokens": 40 if t == 0 else 10, "output_tokens": 8, "arrival_s": 0}
             for s in ("a", "b") for t in range(3)]
    trace.write_text("\n".join(json.dumps(turn) for turn in turns) + "\n")
    with serve(tiny_model_dir, "--prefill", "1", "--decode", "1", "--devices", "cpu:0,cpu:1") as url:
        result = fleetctl("bench", "--url", url, "--trace", str(trace), "--json")
        assert result.returncode == 0, result.stderr
        status = httpx.get(f"{url}/fleet/status", timeout=10).json()
        records = requests_by_order(url)
    body = json.loads(result.stdout)
    assert (body["trace"], body["requests"], body["errors"]) == ("sessions.jsonl", 6, 0)
    assert body["ttft_first_turn_s"]["p50"] > 0 and body["ttft_later_turns_s"]["p50"] > 0
    later = sorted(records, key=lambda r: r["arrival"])[2:]  # each session's first turn comes first
    assert len(later) == 4 and all(r["prefill_cached_tokens"] >= 16 for r in later)
    # a short new part (default --local-prefill-tokens): the decode worker holding the conversation prefills it
    assert all(r["local_prefill"] for r in later) and status["pools"]["decode"]["prefix_hit_ratio"] > 0.3
