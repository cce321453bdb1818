"""shape_logits(): logit_bias, min_tokens, the repetition / presence / frequency penalties, each against its
definition written out token by token here, and the grammar's bitmask unpacked bit by bit."""

import math

import pytest
import torch

from fleetctl.engine.core.logits_shaping import allowed_tokens, shape_logits
from fleetctl.engine.core.sampler import sample
from fleetctl.engine.core.sequence import SamplingError, SamplingParams, Sequence

VOCAB = 40
EOS = frozenset({2})
SHAPING = {"presence_penalty", "frequency_penalty", "repetition_penalty", "logit_bias", "min_tokens"}


def logits_row(seed: int = 0) -> torch.Tensor:
    return torch.randn(1, VOCAB, generator=torch.Generator().manual_seed(seed)) * 3


def seq(params: SamplingParams, prompt: list[int], output: list[int]) -> Sequence:
    return Sequence(list(prompt), params, output_token_ids=list(output), seed=1)


def reference(raw: list[float], params: SamplingParams, prompt: list[int], output: list[int]) -> list[float]:
    """The definitions, one token at a time (vLLM's order: bias, min_tokens, repetition, presence/frequency)."""
    out = list(raw)
    for token, bias in params.logit_bias:
        out[token] += bias
    if len(output) < params.min_tokens:
        for token in EOS:
            out[token] = -math.inf
    for token in set(prompt) | set(output):
        value = out[token]
        out[token] = value / params.repetition_penalty if value > 0 else value * params.repetition_penalty
    for token in set(output):
        out[token] -= output.count(token) * params.frequency_penalty + params.presence_penalty
    return out


@pytest.mark.parametrize("params", [
    SamplingParams(presence_penalty=0.7),
    SamplingParams(frequency_penalty=0.4),
    SamplingParams(frequency_penalty=-0.5, presence_penalty=1.5),
    SamplingParams(repetition_penalty=1.3),
    SamplingParams(repetition_penalty=0.8, presence_penalty=-0.3),
    SamplingParams(logit_bias=((3, 5.0), (17, -100.0), (39, 2.5))),
    SamplingParams(min_tokens=8, frequency_penalty=0.2),
    SamplingParams(min_tokens=2, logit_bias=((2, 50.0),), repetition_penalty=1.1),
], ids=lambda p: ",".join(f"{k}={v}" for k, v in vars(p).items() if k in SHAPING and v not in (0, 1.0, ())))
def test_each_shaping_follows_its_definition(params: SamplingParams) -> None:
    prompt, output = [1, 3, 5, 5, 9], [5, 7, 7, 7, 2, 11]
    raw = logits_row()
    shaped = shape_logits(raw, [seq(params, prompt, output)], EOS)
    expected = reference(raw[0].tolist(), params, prompt, output)
    assert shaped[0].tolist() == pytest.approx(expected)
    assert raw[0].tolist() == logits_row()[0].tolist()  # the raw logits (logprobs read them) stay raw


def test_min_tokens_holds_eos_back_only_until_reached() -> None:
    params = SamplingParams(temperature=0.0, min_tokens=3, max_tokens=10)
    raw = torch.zeros(1, VOCAB)
    raw[0, 2] = 10.0  # EOS is the argmax
    assert sample(raw, [seq(params, [1], [4, 4])], EOS) != [2]
    assert sample(raw, [seq(params, [1], [4, 4, 4])], EOS) == [2]


def test_unshaped_rows_pass_through_untouched_in_a_mixed_batch() -> None:
    raw = torch.cat([logits_row(1), logits_row(2)])
    shaped = shape_logits(raw, [seq(SamplingParams(), [1], [3]), seq(SamplingParams(presence_penalty=1.0), [1], [3])],
                          EOS)
    assert shaped[0].tolist() == raw[0].tolist()
    assert shaped[1, 3] == pytest.approx(raw[1, 3] - 1.0)
    assert shape_logits(raw, [seq(SamplingParams(), [1], [3])] * 2, EOS) is raw  # nothing shaped: no copy


def test_bitmask_unpacks_bit_t_of_word_t_over_32() -> None:
    allowed = {0, 5, 31, 32, 33, 63, 64, 70}
    words = [0, 0, 0]
    for token in allowed:
        words[token // 32] |= 1 << (token % 32)
    bitmask = torch.tensor([[w - (1 << 32) if w >= 1 << 31 else w for w in words]], dtype=torch.int32)
    assert set(allowed_tokens(bitmask, 71)[0].nonzero().flatten().tolist()) == allowed


@pytest.mark.parametrize(("field", "value"), [("presence_penalty", 2.5), ("frequency_penalty", -3.0),
                                              ("repetition_penalty", 0.0), ("min_tokens", 20),
                                              ("logit_bias", ((1, 101.0),)), ("logit_bias", ((-1, 1.0),))])
def test_out_of_range_values_are_refused(field: str, value: object) -> None:
    with pytest.raises(SamplingError, match=field.split("_")[0]):
        SamplingParams(max_tokens=16, **{field: value})  # type: ignore[arg-type]
