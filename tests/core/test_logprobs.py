"""token_logprobs(): the model's raw log-probabilities of the sampled tokens, only for requests that ask."""

from pathlib import Path

import pytest
import torch

from fleetctl.engine.core.engine_settings import EngineConfig, EngineSettings
from fleetctl.engine.core.llm_engine import LLMEngine
from fleetctl.engine.core.logprobs import token_logprobs
from fleetctl.engine.core.sequence import MAX_LOGPROBS, SamplingError, SamplingParams, Sequence


def seq(logprobs: int | None, temperature: float = 1.0) -> Sequence:
    return Sequence([1, 2, 3], SamplingParams(logprobs=logprobs, temperature=temperature), seed=7)


def test_sampled_and_top_logprobs_are_the_raw_log_softmax() -> None:
    logits = torch.randn(3, 40, generator=torch.Generator().manual_seed(0))
    tokens = [5, 17, 39]
    out = token_logprobs(logits, [seq(3, temperature=0.5), seq(None), seq(0)], tokens)
    reference = torch.log_softmax(logits, dim=-1)
    first = out[0]
    assert first is not None and first.logprob == pytest.approx(float(reference[0, 5]), abs=1e-6)
    values, ids = reference[0].topk(3)
    assert [t for t, _ in first.top] == ids.tolist()
    assert [v for _, v in first.top] == pytest.approx(values.tolist(), abs=1e-6)
    assert out[1] is None  # not asked: nothing computed for it
    assert out[2] is not None and out[2].top == () and out[2].logprob == pytest.approx(float(reference[2, 39]))


def test_no_request_asks_nothing_is_computed() -> None:
    assert token_logprobs(torch.zeros(2, 8), [seq(None), seq(None)], [0, 1]) == [None, None]


def test_logprobs_bounds() -> None:
    SamplingParams(logprobs=MAX_LOGPROBS)
    for bad in (-1, MAX_LOGPROBS + 1):
        with pytest.raises(SamplingError, match="logprobs"):
            SamplingParams(logprobs=bad)


def test_engine_reports_logprobs_for_every_token_of_a_request_that_asks(tiny_model_dir: Path) -> None:
    engine = LLMEngine(EngineConfig(tiny_model_dir, settings=EngineSettings(dtype="float32", num_kv_blocks=64)))
    asks = engine.add_request("The quick brown fox", SamplingParams(max_tokens=6, temperature=0.0, logprobs=2,
                                                                    ignore_eos=True))
    silent = engine.add_request("Once upon a time", SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True))
    outputs = []
    while engine.has_unfinished():
        outputs += engine.step()
    mine = [o for o in outputs if o.request_id == asks.request_id]
    assert len(mine) == 6 and all(o.logprobs is not None and len(o.logprobs.top) == 2 for o in mine)
    for o in mine:  # greedy: the sampled token is the most likely one
        assert o.logprobs is not None and o.logprobs.top[0] == (o.token_id, pytest.approx(o.logprobs.logprob))
    assert all(o.logprobs is None for o in outputs if o.request_id == silent.request_id)
