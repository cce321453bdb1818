"""The OpenAI parameters beyond one prompt and one answer, on a real fleet (tiny model, deterministic fp32):
logprobs (completions and chat, streamed and not), `n` parallel samples, a list of prompts, `echo`; a structured
request counted in the pools that computed it."""

import json
from pathlib import Path

import httpx
import openai
import pytest
from support.fleet_harness import serve

from fleetctl.engine.core.engine_settings import EngineConfig, EngineSettings
from fleetctl.engine.core.llm_engine import LLMEngine
from fleetctl.engine.core.sequence import SamplingParams

pytestmark = pytest.mark.fleet

MODEL = "tiny-llama0"
FLEET = ("--prefill", "2", "--decode", "1", "--devices", "cpu:0,cpu:1,cpu:2", "--dtype", "float32",
         "--deterministic", "--kv-blocks", "128")
PROMPT = "The quick brown fox jumps over the lazy dog, and then it runs far away into the woods"


@pytest.fixture(scope="module")
def url(tiny_model_dir: Path):
    with serve(tiny_model_dir, *FLEET) as fleet_url:
        yield fleet_url


def api(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=120)


def engine_logprobs(model_dir: Path, prompt: str, max_tokens: int, k: int) -> list[tuple[int, float, list]]:
    """The same request in one engine, in-process: (token, logprob, top k) per generated token."""
    engine = LLMEngine(EngineConfig(model_dir, settings=EngineSettings(dtype="float32", deterministic=True,
                                                                       num_kv_blocks=64)))
    engine.add_request(prompt, SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True, logprobs=k))
    out = []
    while engine.has_unfinished():
        out += [(o.token_id, o.logprobs.logprob, list(o.logprobs.top)) for o in engine.step() if o.logprobs]
    return out


def test_completion_logprobs_are_the_models_streamed_or_not(url: str, tiny_model_dir: Path) -> None:
    reference = engine_logprobs(tiny_model_dir, PROMPT, 8, 3)
    done = api(url).completions.create(model=MODEL, prompt=PROMPT, max_tokens=8, temperature=0, logprobs=3,
                                       extra_body={"ignore_eos": True})
    lp = done.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == len(lp.text_offset) == 8
    assert lp.token_logprobs == pytest.approx([value for _, value, _ in reference], abs=1e-4)
    for top, (_, value, alternatives) in zip(lp.top_logprobs, reference, strict=True):
        # k alternatives and the sampled token, keyed by text (two partial characters both read U+FFFD)
        assert 1 <= len(top) <= 4 and max(top.values()) == pytest.approx(alternatives[0][1], abs=1e-4)
        assert max(top.values()) == pytest.approx(value, abs=1e-4)  # greedy: the sampled token is the best
    assert "".join(lp.tokens).startswith(done.choices[0].text)  # a character left incomplete is not in the text
    assert lp.text_offset == [sum(len(t) for t in lp.tokens[:i]) for i in range(8)]
    chunks = [c for c in api(url).completions.create(model=MODEL, prompt=PROMPT, max_tokens=8, temperature=0,
                                                     logprobs=3, stream=True, extra_body={"ignore_eos": True})]
    streamed = [v for c in chunks for v in (c.choices[0].logprobs.token_logprobs if c.choices[0].logprobs else [])]
    offsets = [v for c in chunks for v in (c.choices[0].logprobs.text_offset if c.choices[0].logprobs else [])]
    assert streamed == lp.token_logprobs and offsets == lp.text_offset


def test_chat_logprobs_and_top_logprobs(url: str) -> None:
    messages = [{"role": "user", "content": "Say something"}]
    done = api(url).chat.completions.create(model=MODEL, messages=messages, max_tokens=6, temperature=0,
                                            logprobs=True, top_logprobs=2)
    content = done.choices[0].logprobs.content
    assert len(content) == done.usage.completion_tokens
    for entry in content:
        assert entry.logprob <= 0 and bytes(entry.bytes).decode(errors="replace") == entry.token
        assert len(entry.top_logprobs) == 2 and entry.top_logprobs[0].logprob == pytest.approx(entry.logprob)
    chunks = list(api(url).chat.completions.create(model=MODEL, messages=messages, max_tokens=6, temperature=0,
                                                   logprobs=True, stream=True))
    streamed = [e for c in chunks if c.choices and c.choices[0].logprobs for e in c.choices[0].logprobs.content]
    assert [e.logprob for e in streamed] == [e.logprob for e in content]
    assert all(e.top_logprobs == [] for e in streamed)  # logprobs without top_logprobs: no alternatives
    plain = api(url).chat.completions.create(model=MODEL, messages=messages, max_tokens=2)
    assert plain.choices[0].logprobs is None


def test_n_samples_share_one_prefill_worker_and_draw_like_single_requests(url: str) -> None:
    n = api(url).completions.create(model=MODEL, prompt=PROMPT, max_tokens=10, temperature=0.9, seed=5, n=4,
                                    extra_headers={"X-Request-Id": "par"})
    assert [c.index for c in n.choices] == [0, 1, 2, 3] and n.id == "par"
    prompt_tokens = len(httpx.post(f"{url}/tokenize", json={"prompt": PROMPT}, timeout=10).json()["tokens"])
    assert n.usage.prompt_tokens == prompt_tokens  # counted once: the samples share it
    assert n.usage.completion_tokens == 4 * 10
    for i, choice in enumerate(n.choices):  # sample i draws with seed + i
        alone = api(url).completions.create(model=MODEL, prompt=PROMPT, max_tokens=10, temperature=0.9, seed=5 + i)
        assert choice.text == alone.choices[0].text
    assert len({c.text for c in n.choices}) > 1
    records = {r["request_id"]: r for r in httpx.get(f"{url}/fleet/requests", timeout=10).json()["requests"]}
    workers = {records[f"par-{i}"]["prefill_worker"] for i in range(4)}
    assert len(workers) == 1  # one prefill worker computed the prompt's blocks for all four


def test_n_streams_interleave_by_index(url: str) -> None:
    chunks = list(api(url).chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}],
                                                   max_tokens=8, temperature=0.8, seed=1, n=3, stream=True,
                                                   stream_options={"include_usage": True}))
    texts = {i: "".join(c.choices[0].delta.content or "" for c in chunks if c.choices and c.choices[0].index == i)
             for i in range(3)}
    done = api(url).chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}],
                                            max_tokens=8, temperature=0.8, seed=1, n=3)
    assert texts == {c.index: c.message.content for c in done.choices}
    finals = [c.choices[0].index for c in chunks if c.choices and c.choices[0].finish_reason]
    assert sorted(finals) == [0, 1, 2]
    assert chunks[-1].usage.completion_tokens == done.usage.completion_tokens


def test_a_list_of_prompts_gets_prompt_major_choices(url: str) -> None:
    prompts = ["Once upon a time", "def add(a, b):"]
    done = api(url).completions.create(model=MODEL, prompt=prompts, max_tokens=5, temperature=0, n=2)
    assert [c.index for c in done.choices] == [0, 1, 2, 3]
    for p, prompt in enumerate(prompts):
        alone = api(url).completions.create(model=MODEL, prompt=prompt, max_tokens=5, temperature=0)
        assert done.choices[2 * p].text == done.choices[2 * p + 1].text == alone.choices[0].text
    ids = api(url).completions.create(model=MODEL, prompt=[[5, 6, 7], [8, 9]], max_tokens=2, temperature=0)
    assert len(ids.choices) == 2 and ids.usage.prompt_tokens == 5


def test_echo_prepends_the_prompt(url: str) -> None:
    done = api(url).completions.create(model=MODEL, prompt=PROMPT, max_tokens=4, temperature=0, echo=True)
    plain = api(url).completions.create(model=MODEL, prompt=PROMPT, max_tokens=4, temperature=0)
    assert done.choices[0].text == PROMPT + plain.choices[0].text
    streamed = "".join(c.choices[0].text for c in api(url).completions.create(
        model=MODEL, prompt=PROMPT, max_tokens=4, temperature=0, echo=True, stream=True))
    assert streamed == done.choices[0].text


@pytest.mark.parametrize(("route", "extra", "param"), [
    ("completions", {"echo": True, "logprobs": 1}, "echo"),
    ("completions", {"logprobs": 21}, "logprobs"),
    ("completions", {"n": 17}, "n"),
    ("completions", {"prompt": []}, "prompt"),
    ("chat/completions", {"top_logprobs": 2}, "top_logprobs"),
    ("chat/completions", {"logprobs": True, "top_logprobs": 30}, "top_logprobs"),
    ("chat/completions", {"best_of": 2}, "best_of"),
    ("chat/completions", {"frequency_penalty": 2.5}, "frequency_penalty"),
    ("chat/completions", {"repetition_penalty": 0}, "repetition_penalty"),
    ("completions", {"logit_bias": {"abc": 1}}, "logit_bias"),
    ("completions", {"logit_bias": {"5": 101}}, "logit_bias"),
    ("completions", {"min_tokens": 3}, "min_tokens"),
    ("completions", {"response_format": {"type": "json_schema"}}, "json_schema"),
    ("chat/completions", {"response_format": {"type": "json_schema", "json_schema": {
        "name": "x", "schema": {"type": "object", "properties": {"a": {"type": "string", "x": "y" * 70_000}}}}}},
     "65,536"),
    ("chat/completions", {"response_format": {"type": "json_schema", "json_schema": {
        "name": "x", "schema": {"type": "object", "dependentSchemas": {"a": {}}}}}}, "grammar"),
])
def test_what_is_not_implemented_or_out_of_range_is_refused_by_name(url: str, route: str, extra: dict,
                                                                    param: str) -> None:
    body = {"model": MODEL, "max_tokens": 2}
    body |= {"prompt": "hi"} if route == "completions" else {"messages": [{"role": "user", "content": "hi"}]}
    response = httpx.post(f"{url}/v1/{route}", json=body | extra, timeout=30)
    assert response.status_code == 400 and param in response.json()["error"]["message"], response.text


PERSON = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 12},
                                           "age": {"type": "integer", "minimum": 0, "maximum": 120},
                                           "tags": {"type": "array", "items": {"enum": ["a", "b"]}, "maxItems": 3}},
          "required": ["name", "age", "tags"], "additionalProperties": False}


def valid_person(text: str) -> bool:
    value = json.loads(text)
    return (set(value) == {"name", "age", "tags"} and isinstance(value["name"], str) and len(value["name"]) <= 12
            and isinstance(value["age"], int) and 0 <= value["age"] <= 120
            and all(tag in ("a", "b") for tag in value["tags"]) and len(value["tags"]) <= 3)


def test_json_schema_output_is_valid_at_temperature_one_chat_and_completions_streamed_or_not(url: str) -> None:
    """A random tiny model (its free text is noise): every seeded sample parses and holds the schema."""
    response_format = {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON, "strict": True}}
    client = api(url)
    texts = [client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Who?"}], temperature=1.0, seed=seed, max_tokens=120,
        response_format=response_format).choices[0].message.content for seed in range(8)]
    texts += [client.completions.create(model=MODEL, prompt="Who?", temperature=1.0, seed=seed, max_tokens=120,
                                        extra_body={"response_format": response_format}).choices[0].text
              for seed in range(8, 12)]
    streamed = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Who?"}], temperature=1.0, seed=99, max_tokens=120,
        response_format=response_format, stream=True)
    texts.append("".join(c.choices[0].delta.content or "" for c in streamed if c.choices))
    assert all(valid_person(text) for text in texts), texts
    free = client.completions.create(model=MODEL, prompt="Who?", temperature=1.0, seed=0, max_tokens=40).choices[0]
    assert not free.text.startswith("{")  # without the format the model writes no JSON at all


def test_json_cut_by_max_tokens_ends_with_length_and_json_object_is_any_object(url: str) -> None:
    person = {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON}}
    done = api(url).chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=3,
                                            temperature=1.0, seed=1, response_format=person)
    assert done.choices[0].finish_reason == "length" and done.choices[0].message.content.startswith('{"')
    for seed in range(4):
        anything = api(url).chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=60, temperature=1.0, seed=seed,
            response_format={"type": "json_object"}).choices[0]
        assert anything.finish_reason == "stop" and isinstance(json.loads(anything.message.content), dict)


def test_a_structured_request_counts_in_each_pool_that_computed_it(url: str) -> None:
    def counted() -> dict[str, int]:
        pools = httpx.get(f"{url}/fleet/status", timeout=10).json()["pools"]
        return {role: pool["structured_requests"].get("json_object", 0) for role, pool in pools.items()}

    before = counted()
    done = api(url).completions.create(model=MODEL, prompt="Who?", max_tokens=4, temperature=1.0, seed=5,
                                       extra_body={"response_format": {"type": "json_object"}})
    record = next(r for r in httpx.get(f"{url}/fleet/requests", timeout=10).json()["requests"]
                  if r["request_id"] == done.id)
    ran = {worker.split("-")[0] for worker in (record["prefill_worker"], record["decode_worker"]) if worker}
    assert ran and counted() == {role: n + (role in ran) for role, n in before.items()}


def test_logit_bias_and_min_tokens_steer_greedy_decoding(url: str) -> None:
    client = api(url)
    plain = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=4, temperature=0, logprobs=0)
    forced = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=4, temperature=0,
                                       logit_bias={"65": 100}, extra_body={"ignore_eos": True})
    assert forced.usage.completion_tokens == 4 and forced.choices[0].text != plain.choices[0].text
    eos = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=6, temperature=0,
                                    logit_bias={"2": 100})  # EOS (<|im_end|>): ends at once
    assert eos.usage.completion_tokens == 1 and eos.choices[0].finish_reason == "stop"
    held = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=6, temperature=0,
                                     logit_bias={"2": 100}, extra_body={"min_tokens": 4})
    assert held.usage.completion_tokens == 5 and held.choices[0].finish_reason == "stop"
