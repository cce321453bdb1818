"""KV tiers on a real fleet (worker processes on CPU slots, HTTP): a prompt whose blocks its prefill worker's
small pool reclaimed comes back from the host tier — the request's record in /fleet/requests names the tier and
its tokens, /metrics counts them in `fleet_kv_tier_hits_total{tier}` — and its answer is token-identical to the
first time, when it was computed (`--deterministic`)."""

from pathlib import Path

import httpx
import pytest
from support.fleet_harness import serve

pytestmark = pytest.mark.fleet  # real worker processes and a real server

PROMPT = [(7 * i) % 300 + 3 for i in range(90)]  # 5 full blocks of 16 and 10 tokens more
OTHERS = [[(11 * i + 13 * n) % 300 + 3 for i in range(90)] for n in range(1, 4)]


def complete(url: str, prompt: list[int], request_id: str, session: str = "") -> list[int]:
    body = {"model": "tiny-llama0", "prompt": prompt, "max_tokens": 4, "temperature": 0, "ignore_eos": True,
            "logprobs": 1}
    headers = {"X-Request-Id": request_id} | ({"X-Session-Id": session} if session else {})
    response = httpx.post(f"{url}/v1/completions", json=body, headers=headers, timeout=120)
    assert response.status_code == 200, response.text
    return response.json()["choices"][0]["logprobs"]["tokens"]


def record(url: str, request_id: str) -> dict:
    rows = httpx.get(f"{url}/fleet/requests", params={"limit": 100}, timeout=10).json()["requests"]
    [row] = [r for r in rows if r["request_id"] == request_id]
    return row


def fleet_args(tmp_path: Path, kv_blocks: int, *more: str) -> tuple[str, ...]:
    return ("--prefill", "1", "--decode", "1", "--devices", "cpu:0,cpu:1", "--dtype", "float32", "--deterministic",
            "--kv-blocks", str(kv_blocks), "--local-prefill-tokens", "0", "--kv-offload-memory", "16",
            "--kv-offload-host-dir", str(tmp_path / "host"), *more)


def test_a_prefix_the_pool_lost_comes_back_from_the_host_tier(tiny_model_dir: Path, tmp_path: Path) -> None:
    with serve(tiny_model_dir, *fleet_args(tmp_path, 8)) as url:
        assert httpx.get(f"{url}/v1/models", timeout=10).json()["data"][0]["max_model_len"] == 8 * 16  # the pool's
        first = complete(url, PROMPT, "first")
        assert record(url, "first")["tier_cached_tokens"] == {}
        for n, other in enumerate(OTHERS):  # through the 8-block pools: PROMPT's blocks are reclaimed, to the tier
            complete(url, other, f"other-{n}")
        again = complete(url, PROMPT, "again")
        assert again == first
        row = record(url, "again")
        assert row["tier_cached_tokens"] == {"host": 80}, row  # every full block before the last token's
        assert row["prefill_cached_tokens"] == 80 and row["prefill_worker"] == "prefill-0"
        metrics = httpx.get(f"{url}/metrics", timeout=10).text
        assert 'fleet_kv_tier_hits_total{role="prefill",tier="host",worker="prefill-0"} 80.0' in metrics
        samples = {line.split(" ")[0]: float(line.split(" ")[1]) for line in metrics.splitlines()
                   if line.startswith("fleet_kv_tier_") and " " in line}
        read = samples['fleet_kv_tier_read_bytes_total{tier="host",worker="prefill-0"}']
        assert read > 0 and samples['fleet_kv_tier_read_seconds_total{tier="host",worker="prefill-0"}'] > 0
        used, bound = (samples[f'fleet_kv_tier_{name}_bytes{{tier="host"}}'] for name in ("used", "capacity"))
        assert 0 < used <= bound
        status = httpx.get(f"{url}/fleet/status", timeout=10).json()  # what the console's tier line shows
        assert status["pools"]["prefill"]["tier_tokens"] == {"host": 80}
        assert status["kv_tiers"]["host"] == {"used_bytes": used, "capacity_bytes": bound}


def test_a_sessions_next_turn_finds_its_prefix_kept_in_the_pool(tiny_model_dir: Path, tmp_path: Path) -> None:
    """16 blocks a worker: the session's 5 and two other prompts' fit; the third other prompt reclaims five
    cached blocks, and with the session's retained it takes another prompt's."""
    with serve(tiny_model_dir, *fleet_args(tmp_path, 16, "--session-ttl", "600")) as url:
        first = complete(url, PROMPT, "turn-1", session="agent-7")
        for n, other in enumerate(OTHERS):
            complete(url, other, f"other-{n}")
        again = complete(url, PROMPT, "turn-2", session="agent-7")
        assert again == first
        row = record(url, "turn-2")
        assert (row["session"], row["prefill_cached_tokens"], row["tier_cached_tokens"]) == ("agent-7", 80, {}), row
        bad = httpx.post(f"{url}/v1/completions", json={"model": "tiny-llama0", "prompt": [5, 6], "max_tokens": 1},
                         headers={"X-Session-Id": "not a session id"}, timeout=30)
        assert bad.status_code == 400 and "X-Session-Id" in bad.json()["error"]["message"]
