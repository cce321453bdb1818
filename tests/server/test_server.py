"""A real fleet (`fleetctl serve`, worker processes, HTTP on 127.0.0.1) on the tiny model.

Token-identity assertions here rely on `--deterministic` (batch-invariant numerics): batch composition
in a fleet depends on timing, so without it greedy outputs could differ in the last bits."""

import asyncio
import os
import signal
import time
from pathlib import Path

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families
from support.fleet_harness import generate_json, serve, wait_until, worker_pids

from fleetctl.engine.fleet.fleet_config import cpu_slot_cores

pytestmark = pytest.mark.fleet  # real worker processes and a real server

PROMPTS = [
    "The quick brown fox",
    "Once upon a time there was a small model",
    "def add(a, b):",
    "Numbers 0 1 2 3 4 5",
    "Prefill reads the prompt in one pass",
    "decode writes the answer a token at a time",
]
FLEET = ("--prefill", "1", "--decode", "2", "--devices", "cpu:0,cpu:1,cpu:2", "--dtype", "float32",
         "--deterministic", "--kv-blocks", "64")
DESIGN_METRICS = {
    "fleet_time_to_first_token_seconds", "fleet_inter_token_latency_seconds", "fleet_e2e_request_latency_seconds",
    "fleet_kv_handoff_seconds", "fleet_kv_handoff_bytes", "fleet_requests_running", "fleet_requests_waiting",
    "fleet_kv_cache_usage_ratio", "fleet_worker_busy_ratio", "fleet_worker_mfu", "fleet_worker_mbu",
    "fleet_migrations", "fleet_worker_failures",
}


@pytest.fixture(scope="module")
def fleet_url(tiny_model_dir: Path):
    with serve(tiny_model_dir, *FLEET) as url:
        yield url


@pytest.fixture(scope="module")
def reference(tiny_model_dir: Path) -> list[dict]:
    """`fleetctl generate` on the same prompts: one batch, one process, same numerics."""
    return generate_json(tiny_model_dir, PROMPTS, "--dtype", "float32", "--deterministic", "--max-tokens", "24")


def client(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=60)


def test_openai_client_completions_chat_and_streaming(fleet_url: str, reference: list[dict]) -> None:
    api = client(fleet_url)
    model = api.models.list().data[0].id
    for prompt, ref in zip(PROMPTS[:3], reference, strict=False):
        done = api.completions.create(model=model, prompt=prompt, max_tokens=24, temperature=0)
        assert done.choices[0].text == ref["text"]
        assert done.usage.completion_tokens == len(ref["token_ids"])
        streamed = "".join(c.choices[0].text for c in api.completions.create(
            model=model, prompt=prompt, max_tokens=24, temperature=0, stream=True) if c.choices)
        assert streamed == ref["text"]
    chat = api.chat.completions.create(model=model, messages=[{"role": "user", "content": "hi"}], max_tokens=8,
                                       temperature=0)
    chunks = list(api.chat.completions.create(model=model, messages=[{"role": "user", "content": "hi"}],
                                              max_tokens=8, temperature=0, stream=True,
                                              stream_options={"include_usage": True}))
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == chat.choices[0].message.content
    assert chunks[-1].usage.completion_tokens == chat.usage.completion_tokens == 8


def _concurrent(url: str, max_tokens: int = 24) -> list[str]:
    async def run() -> list[str]:
        api = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=120)
        calls = [api.completions.create(model="tiny-llama0", prompt=p, max_tokens=max_tokens, temperature=0)
                 for p in PROMPTS]
        calls += [api.completions.create(model="tiny-llama0", prompt=p, max_tokens=max_tokens, temperature=0.8,
                                         seed=7) for p in PROMPTS[:2]]
        return [r.choices[0].text for r in await asyncio.gather(*calls)]

    return asyncio.run(run())


def test_concurrent_requests_are_identical_run_after_run(fleet_url: str, reference: list[dict]) -> None:
    """Six greedy and two seeded streams at once, three times: batch composition differs every run."""
    first = _concurrent(fleet_url)
    assert first == _concurrent(fleet_url) == _concurrent(fleet_url)
    assert first[: len(PROMPTS)] == [r["text"] for r in reference]


def test_bad_requests_get_openai_errors_and_server_keeps_serving(fleet_url: str) -> None:
    url = f"{fleet_url}/v1/completions"
    bad = [
        ("{not json", 400),
        ({"prompt": "hi"}, 400),  # no model
        ({"model": "tiny-llama0"}, 400),  # no prompt
        ({"model": "tiny-llama0", "prompt": "hi", "max_tokens": -3}, 400),
        ({"model": "tiny-llama0", "prompt": "hi", "max_tokens": 10**9}, 400),
        ({"model": "tiny-llama0", "prompt": "hi", "max_tokens": "many"}, 400),
        ({"model": "tiny-llama0", "prompt": "hi", "temperature": "hot"}, 400),
        ({"model": "tiny-llama0", "prompt": 42}, 400),
        ({"model": "no-such-model", "prompt": "hi"}, 404),
        ({"model": "tiny-llama0", "prompt": "word " * 2000}, 400),  # longer than the 512-token context
        ({"model": "tiny-llama0", "prompt": [10**7]}, 400),  # token id out of the vocabulary
    ]
    for body, status in bad:
        kwargs = {"content": body} if isinstance(body, str) else {"json": body}
        response = httpx.post(url, headers={"content-type": "application/json"}, timeout=30, **kwargs)
        assert response.status_code == status, (body, response.text)
        error = response.json()["error"]
        assert error["message"] and error["type"]
    chat = httpx.post(f"{fleet_url}/v1/chat/completions", json={"model": "tiny-llama0", "messages": []}, timeout=30)
    assert chat.status_code == 400
    # greedy, so the tiny model's answer is the same every run (sampled at the default temperature 1.0 it
    # can draw the end-of-text token before the third)
    ok = httpx.post(url, json={"model": "tiny-llama0", "prompt": "hi", "max_tokens": 3, "temperature": 0}, timeout=30)
    assert ok.status_code == 200 and ok.json()["usage"]["completion_tokens"] == 3


@pytest.mark.parametrize(("extra", "param"), [
    ({"functions": [{"name": "f"}]}, "functions"),
    ({"response_format": {"type": "json_schema"}}, "response_format"),
    ({"presence_penalty": 2.5}, "presence_penalty"),
    ({"n": 2, "best_of": 3}, "best_of"),
    ({"prompt_logprobs": 1}, "prompt_logprobs"),
    ({"best_of": 3}, "best_of"),
])
def test_parameters_not_implemented_are_refused_by_name(fleet_url: str, extra: dict, param: str) -> None:
    body = {"model": "tiny-llama0", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2} | extra
    response = httpx.post(f"{fleet_url}/v1/chat/completions", json=body, timeout=30)
    assert response.status_code == 400 and param in response.json()["error"]["message"], response.text


def test_neutral_values_of_unimplemented_parameters_are_accepted(fleet_url: str) -> None:
    body = {"model": "tiny-llama0", "prompt": "hi", "max_tokens": 2, "n": 1, "presence_penalty": 0,
            "logprobs": None, "echo": False}
    assert httpx.post(f"{fleet_url}/v1/completions", json=body, timeout=30).status_code == 200


@pytest.mark.parametrize("content", [
    '{"model": "tiny-llama0", "messages": [{"role": "user", "content": [{"type": "image_url", "url": "x"}]}]}',
    '{"model": "tiny-llama0", "messages": [{"role": "user", "content": [42]}]}',
    '{"model": "tiny-llama0", "messages": [{"role": "user", "content": "\\ud800 lone"}]}',
    '{"model": "tiny-llama0", "messages": [{"role": "user", "content": "hi"}], "stop": ["' + 'x' * 2000 + '"]}',
])
def test_malformed_chat_bodies_get_400_not_500(fleet_url: str, content: str) -> None:
    response = httpx.post(f"{fleet_url}/v1/chat/completions", content=content,
                          headers={"content-type": "application/json"}, timeout=30)
    assert response.status_code == 400, response.text


def test_a_prompt_too_long_to_fit_is_refused_before_tokenizing(fleet_url: str) -> None:
    start = time.perf_counter()
    response = httpx.post(f"{fleet_url}/v1/completions", json={"model": "tiny-llama0", "prompt": "x" * 2_000_000},
                          timeout=30)
    assert response.status_code == 400 and "characters" in response.json()["error"]["message"]
    assert time.perf_counter() - start < 5


def test_metrics_parse_and_carry_design_names(fleet_url: str) -> None:
    client(fleet_url).completions.create(model="tiny-llama0", prompt="hello", max_tokens=4, temperature=0)
    model = httpx.get(f"{fleet_url}/v1/models", timeout=10).json()["data"][0]
    assert (model["id"], model["max_model_len"]) == ("tiny-llama0", 512)
    text = httpx.get(f"{fleet_url}/metrics", timeout=10).text
    names = {family.name for family in text_string_to_metric_families(text)}
    assert names >= DESIGN_METRICS, DESIGN_METRICS - names
    status = httpx.get(f"{fleet_url}/fleet/status", timeout=10).json()
    assert set(status["pools"]) == {"prefill", "decode"}
    assert {w["id"] for w in status["workers"]} == {"prefill-0", "decode-0", "decode-1"}


def test_workers_are_pinned_to_their_cpu_slots(fleet_url: str) -> None:
    cores = sorted(os.sched_getaffinity(0))
    pinned = {wid: os.sched_getaffinity(pid) for wid, pid in worker_pids(fleet_url).items()}
    slots = {"prefill-0": 0, "decode-0": 1, "decode-1": 2}  # FLEET's --devices cpu:0,cpu:1,cpu:2
    assert pinned == {wid: set(cpu_slot_cores(slot, 3, cores)) for wid, slot in slots.items()}
    if len(cores) >= 3:  # enough cores: the three slots do not overlap
        assert not (pinned["prefill-0"] & pinned["decode-0"]) and not (pinned["decode-0"] & pinned["decode-1"])
    records = httpx.get(f"{fleet_url}/fleet/requests", timeout=10).json()["requests"]
    # each one handed over from the prefill worker, or prefilled by a decode worker caching most of it
    assert records and all(r["handoff_bytes"] > 0 or r["local_prefill"] for r in records if r["output_tokens"] > 1)


def test_a_records_token_counts_hold_its_tokens_after_the_first_over_its_decode(fleet_url: str) -> None:
    done = client(fleet_url).completions.create(model="tiny-llama0", prompt=PROMPTS[3], max_tokens=24, temperature=0,
                                                extra_body={"ignore_eos": True})
    records = httpx.get(f"{fleet_url}/fleet/requests", timeout=10).json()["requests"]
    record = next(r for r in records if r["request_id"] == done.id)
    counts, bucket = record["token_counts"], record["token_bucket_s"]
    assert sum(counts) == record["output_tokens"] - 1 == 23 and counts[-1] > 0  # the last token in the last bucket
    assert (len(counts) - 1) * bucket <= record["e2e_s"] - record["ttft_s"]  # its buckets start at the first


def test_killed_decode_worker_loses_no_stream(tiny_model_dir: Path, reference: list[dict]) -> None:
    """SIGKILL a decode worker mid-stream: its sequences are recomputed on the other decode worker
    (deterministic numerics) and every client stream completes with the unchanged greedy output. Without
    restarts, a fleet that lost every decode worker answers 503."""
    long_ref = generate_json(tiny_model_dir, PROMPTS, "--dtype", "float32", "--deterministic",
                             "--max-tokens", "300")
    with serve(tiny_model_dir, *FLEET, "--no-restart") as url:

        async def run() -> list[str]:
            api = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=120)

            async def one(prompt: str) -> str:
                stream = await api.completions.create(model="tiny-llama0", prompt=prompt, max_tokens=300,
                                                      temperature=0, stream=True)
                return "".join([c.choices[0].text async for c in stream if c.choices])

            tasks = [asyncio.create_task(one(p)) for p in PROMPTS]
            holding = lambda: httpx.get(f"{url}/fleet/workers", timeout=5).json()["workers"]  # noqa: E731
            assert await asyncio.to_thread(wait_until, lambda: any(w["id"] == "decode-0" and w["sessions"] >= 2
                                                                   for w in holding()), 30)
            os.kill(worker_pids(url)["decode-0"], signal.SIGKILL)
            return await asyncio.gather(*tasks)

        texts = asyncio.run(run())
        assert texts == [r["text"] for r in long_ref]
        states = {w["id"]: w["state"] for w in httpx.get(f"{url}/fleet/workers", timeout=5).json()["workers"]}
        assert states["decode-0"] == "failed"
        os.kill(worker_pids(url)["decode-1"], signal.SIGKILL)
        assert wait_until(lambda: httpx.get(f"{url}/health", timeout=5).status_code == 503)
        response = httpx.post(f"{url}/v1/completions", json={"model": "tiny-llama0", "prompt": "hi"}, timeout=10)
        assert response.status_code == 503 and "decode" in response.json()["error"]["message"]
