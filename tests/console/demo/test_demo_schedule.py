"""`fleetctl demo`'s traffic plan without a fleet: phase switching, request shapes by phase and by
model context, and the Little's-law arrival rate with its cap."""

import statistics

import pytest

from fleetctl.console.demo.schedule import (
    MAX_RATE,
    ArrivalRate,
    DemoPhase,
    PhaseShape,
    TrafficConfig,
    TrafficSchedule,
    phase_shapes,
)
from fleetctl.errors import UserError

TINY = TrafficConfig(context_len=512, prompt_workers=1, decode_workers=2, phase_seconds=8.0)
SMOLLM2 = TrafficConfig(context_len=8192, prompt_workers=1, decode_workers=2)


def test_phases_alternate_rag_then_agent_at_each_boundary() -> None:
    schedule = TrafficSchedule(TINY)
    assert [schedule.phase_at(t) for t in (0.0, 7.99, 8.0, 15.9, 16.0, 24.5)] == [
        (0, DemoPhase.RAG), (0, DemoPhase.RAG), (1, DemoPhase.AGENT), (1, DemoPhase.AGENT),
        (2, DemoPhase.RAG), (3, DemoPhase.AGENT),
    ]
    assert schedule.phase_at(-1.0) == (0, DemoPhase.RAG)  # clock skew before the start
    assert [schedule.phase_end(i) for i in range(3)] == [8.0, 16.0, 24.0]


@pytest.mark.parametrize("config", [TINY, SMOLLM2, TrafficConfig(context_len=128, prompt_workers=1,
                                                                 decode_workers=1)])
def test_rag_is_prompt_heavy_and_agent_decode_heavy_and_both_fit_the_context(config: TrafficConfig) -> None:
    shapes = phase_shapes(config)
    rag, agent = shapes[DemoPhase.RAG], shapes[DemoPhase.AGENT]
    assert rag.prompt_tokens[0] > agent.prompt_tokens[1]  # every RAG prompt is longer than any agent prompt
    assert agent.output_tokens[0] > rag.output_tokens[1]  # every agent answer is longer than any RAG answer
    assert rag.prompt_tokens[0] >= 8 * rag.output_tokens[1]
    assert agent.output_tokens[0] >= 2 * agent.prompt_tokens[1]
    for shape in shapes.values():
        # a 50 % margin: prompts are drawn in words, and the tokenizer decides the exact count
        assert shape.prompt_tokens[1] + shape.output_tokens[1] <= config.context_len / 1.5


def test_lengths_scale_with_the_context_up_to_the_cpu_friendly_caps() -> None:
    tiny, smol = phase_shapes(TINY), phase_shapes(SMOLLM2)
    assert tiny[DemoPhase.RAG].prompt_tokens == (128, 256)
    assert tiny[DemoPhase.AGENT].output_tokens == (64, 128)
    assert smol[DemoPhase.RAG].prompt_tokens == (384, 768)  # capped: 2048..4096 would take a CPU slot minutes
    assert smol[DemoPhase.AGENT].output_tokens == (64, 128)  # ~10-20 s at a CPU slot's ~130 ms per token


def test_in_flight_targets_follow_the_pools() -> None:
    shapes = phase_shapes(TrafficConfig(context_len=2048, prompt_workers=3, decode_workers=5))
    assert (shapes[DemoPhase.RAG].in_flight, shapes[DemoPhase.AGENT].in_flight) == (6, 40)


def test_draws_stay_in_their_phase_ranges_and_convert_tokens_to_words() -> None:
    config = TrafficConfig(context_len=512, prompt_workers=1, decode_workers=2, tokens_per_word=2.0, seed=3)
    schedule = TrafficSchedule(config)
    for phase in DemoPhase:
        shape = schedule.shapes[phase]
        draws = [schedule.draw(phase) for _ in range(200)]
        for req in draws:
            assert shape.output_tokens[0] <= req.max_tokens <= shape.output_tokens[1]
            # two tokens per word: half as many words as tokens wanted (rounded)
            assert shape.prompt_tokens[0] / 2 - 1 <= req.prompt_words <= shape.prompt_tokens[1] / 2 + 1
            assert len(req.prompt.split()) == req.prompt_words
            assert req.arrival_s == 0.0
        assert len({r.max_tokens for r in draws}) > 10  # drawn, not fixed


def test_same_seed_same_traffic() -> None:
    a, b = TrafficSchedule(TINY), TrafficSchedule(TINY)
    assert [a.draw(DemoPhase.RAG) for _ in range(5)] == [b.draw(DemoPhase.RAG) for _ in range(5)]


def test_rate_is_littles_law_on_the_measured_latency() -> None:
    shapes = phase_shapes(TINY)  # RAG keeps 2 in flight, agent 16
    rate = ArrivalRate(shapes)
    assert rate.rate(DemoPhase.RAG) == MAX_RATE  # nothing measured: only the cap paces it
    assert rate.cap(DemoPhase.RAG) == 2
    rate.observe(DemoPhase.RAG, 4.0)
    assert rate.rate(DemoPhase.RAG) == pytest.approx(2 / 4.0)
    assert rate.cap(DemoPhase.RAG) == 4
    rate.observe(DemoPhase.RAG, 14.0)  # slower: fewer arrivals (running mean 4 + 0.3 * 10 = 7)
    assert rate.rate(DemoPhase.RAG) == pytest.approx(2 / 7.0)
    assert rate.rate(DemoPhase.AGENT) == MAX_RATE and rate.cap(DemoPhase.AGENT) == 16  # phases apart
    rate.observe(DemoPhase.AGENT, 0.01)  # a tiny model: bounded
    assert rate.rate(DemoPhase.AGENT) == MAX_RATE


def test_poisson_gaps_have_the_rate_asked_for() -> None:
    schedule = TrafficSchedule(TINY)
    gaps = [schedule.next_gap(4.0) for _ in range(4000)]
    assert statistics.fmean(gaps) == pytest.approx(0.25, rel=0.06)
    assert min(gaps) >= 0.0


def test_bad_configs_are_refused() -> None:
    with pytest.raises(UserError, match="context"):  # the fleet's: one line for the person running the demo
        TrafficConfig(context_len=64, prompt_workers=1, decode_workers=1)
    with pytest.raises(UserError, match="worker"):
        TrafficConfig(context_len=512, prompt_workers=0, decode_workers=1)
    with pytest.raises(UserError, match="positive"):
        TrafficConfig(context_len=512, prompt_workers=1, decode_workers=1, phase_seconds=0)
    with pytest.raises(ValueError, match="range"):
        PhaseShape(prompt_tokens=(10, 5), output_tokens=(1, 2), in_flight=1)
