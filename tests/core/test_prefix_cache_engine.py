"""Prefix caching in a running engine (random Llamas): what a step computes vs serves from the cache,
logits identity with the cache off, multi-turn reuse, and block accounting through finish, abort,
preemption and the prefill-only engine's park → export → release.

Logits and token identity rely on deterministic=True: batch-invariant numerics make a position's K/V
and logits bits the same whether that position was computed in this step or read from a block
another sequence wrote, so the cache may change what is computed but never a bit of the result."""

from collections import Counter
from pathlib import Path

import pytest
import torch
from test_batch_invariance import recorded_logits

from fleetctl.domain import Phase
from fleetctl.engine.core.block_hash import chain_hashes
from fleetctl.engine.core.engine_settings import EngineConfig, EngineSettings
from fleetctl.engine.core.llm_engine import LLMEngine
from fleetctl.engine.core.sequence import SamplingParams
from fleetctl.engine.metrics.cost_model import CostModel
from fleetctl.kernels.batch_invariant import ROW_TILE

GREEDY = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True)
SAMPLED = SamplingParams(max_tokens=6, temperature=0.9, top_p=0.95, seed=11, ignore_eos=True)
SHARED = [(11 * i + 5) % 300 + 3 for i in range(200)]  # inside the random models' vocabulary (384)


def own(n: int, salt: int) -> list[int]:
    return [(7 * i + 13 * salt) % 300 + 3 for i in range(n)]


def make_engine(model_dir: Path, prefix_cache: bool = True, dtype: str = "float32", blocks: int = 64,
                **config: object) -> LLMEngine:
    settings = EngineSettings(dtype=dtype, deterministic=True, num_kv_blocks=blocks, prefix_cache=prefix_cache)
    return LLMEngine(EngineConfig(model_dir, settings=settings, **config))


def run(engine: LLMEngine, prompt: list[int], request_id: str, params: SamplingParams = GREEDY) -> list[int]:
    """Run one request to completion (alone); returns its tokens."""
    seq = engine.add_request(prompt, params, request_id=request_id)
    while engine.has_unfinished():
        engine.step()
    return seq.output_token_ids


def check_blocks(engine: LLMEngine) -> None:
    """Each block's reference count is the number of live block tables holding it; no other block is held."""
    scheduler, manager = engine.scheduler, engine.kv_cache.allocator
    held = Counter(b for s in [*scheduler.running, *scheduler.parked.values()] for b in s.block_table)
    assert all(manager.ref_count(block) == count for block, count in held.items())
    assert manager.num_used == len(held)
    assert manager.num_free + manager.num_used == manager.num_blocks


def assert_all_released(engine: LLMEngine) -> None:
    manager = engine.kv_cache.allocator
    assert not engine.has_unfinished() and not engine.scheduler.parked
    assert manager.num_used == 0 and manager.num_free == manager.num_blocks


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize(
    ("shared", "rest", "hit"),
    [
        (45, 7, 32),  # the shared prefix ends mid-block: only its full blocks are reused
        (80, 7, 80),
        (48, 0, 32),  # the whole prompt is cached: its last block is recomputed
    ],
)
def test_a_cached_prefix_gives_the_logits_bits_of_no_cache(small_model_dir: Path, dtype: str, shared: int,
                                                           rest: int, hit: int) -> None:
    target = SHARED[:shared] + own(rest, 1)
    with recorded_logits() as expected:
        run(make_engine(small_model_dir, prefix_cache=False, dtype=dtype), target, "target", SAMPLED)
    engine = make_engine(small_model_dir, dtype=dtype)
    run(engine, SHARED[:shared] + own(10, 2), "warm")
    with recorded_logits() as rows:
        engine.add_request(target, SAMPLED, request_id="target")
        engine.step()
        assert engine.last_step.cached_tokens == (hit,)
        assert engine.last_step.new_tokens == (len(target) - hit,)
        while engine.has_unfinished():
            engine.step()
    assert rows.keys() == expected.keys() and len(rows) == SAMPLED.max_tokens
    assert all(torch.equal(rows[key], expected[key]) for key in expected)
    assert_all_released(engine)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_a_prefix_partly_evicted_under_pressure_is_recomputed_bit_identically(small_model_dir: Path,
                                                                            dtype: str) -> None:
    target = SHARED[:80] + own(20, 1)
    with recorded_logits() as expected:
        run(make_engine(small_model_dir, prefix_cache=False, dtype=dtype), target, "target")
    engine = make_engine(small_model_dir, dtype=dtype, blocks=12)
    run(engine, SHARED[:80] + own(10, 2), "warm")  # 95 tokens written: SHARED's 5 blocks cached
    assert engine.cached_prefix_tokens(target) == 80
    run(engine, own(130, 3), "filler")  # 9 blocks of a 12-block pool: reclaims 2 cached blocks, tails first
    assert engine.cached_prefix_tokens(target) == 48
    with recorded_logits() as rows:
        engine.add_request(target, GREEDY, request_id="target")
        engine.step()
        assert engine.last_step.cached_tokens == (48,)
        while engine.has_unfinished():
            engine.step()
    assert rows.keys() == expected.keys()
    assert all(torch.equal(rows[key], expected[key]) for key in expected)
    assert_all_released(engine)


def test_turn_two_computes_only_what_turn_one_did_not_write(tiny_model_dir: Path) -> None:
    """Turn 2's prompt is turn 1's prompt + answer + new text: it reuses every full block turn 1
    wrote, answer included (blocks filled while decoding), and the model runs only the rest."""
    # imported here: it imports triton, which tests/kernels must switch to its interpreter first
    from support.linear_flops import linear_flops
    from torch.utils.flop_counter import FlopCounterMode

    engine = make_engine(tiny_model_dir)
    off = make_engine(tiny_model_dir, prefix_cache=False)
    params = SamplingParams(max_tokens=20, temperature=0.0, ignore_eos=True)
    turn1 = own(40, 1)
    answer = run(engine, turn1, "turn-1", params)
    assert answer == run(off, turn1, "turn-1", params)
    turn2 = turn1 + answer + own(10, 2)  # 70 tokens; turn 1 wrote the K/V of 59: 3 full blocks
    second = engine.add_request(turn2, params, request_id="turn-2")
    cost = CostModel(engine.model_config, weight_bytes=4, kv_bytes=4)
    with FlopCounterMode(display=False) as counter:
        engine.step()
    stats = engine.last_step
    assert stats.phase is Phase.PREFILL
    assert stats.cached_tokens == (48,) and stats.new_tokens == (22,) and stats.context_lens == (70,)
    assert stats.num_tokens == 22
    linear = linear_flops(counter)
    def rows(n: int) -> int:  # deterministic mode runs row-wise ops on tiles of ROW_TILE rows
        return -(-n // ROW_TILE) * ROW_TILE

    assert linear == 2 * cost.layer_params * rows(22) + 2 * cost.lm_head_params * rows(1)  # not 70 rows
    while engine.has_unfinished():
        engine.step()
    assert second.output_token_ids == run(off, turn2, "turn-2", params)
    assert_all_released(engine)


def test_blocks_come_back_after_finish_abort_and_preemption(tiny_model_dir: Path) -> None:
    """A pool too small for all four at once (preemption by recompute), prompts sharing a prefix,
    one request aborted mid-decode: reference counts match the block tables after every step, every
    block ends free or cached, and the tokens are those of a roomy engine without a cache."""
    params = SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True)
    prompts = [SHARED[:40] + own(8 + 5 * i, i) for i in range(4)]
    engine = make_engine(tiny_model_dir, blocks=10)
    seqs = [engine.add_request(p, params, request_id=f"r{i}") for i, p in enumerate(prompts)]
    engine.add_request(SHARED[:40] + own(3, 9), params, request_id="aborted")
    steps = 0
    while engine.has_unfinished():
        engine.step()
        check_blocks(engine)
        steps += 1
        if steps == 4:
            engine.release("aborted")
            check_blocks(engine)
    assert engine.scheduler.num_preemptions > 0
    assert_all_released(engine)
    assert engine.kv_cache.allocator.num_cached > 0
    roomy = make_engine(tiny_model_dir, prefix_cache=False)
    assert [s.output_token_ids for s in seqs] == [r.token_ids for r in roomy.generate(prompts, params)]


def test_prefill_only_engine_shares_parked_blocks_and_the_handoff_leaks_nothing(tiny_model_dir: Path) -> None:
    """A prefill worker's second prompt reuses the first one's blocks while they await their handoff;
    the decode engine shares the common prefix it receives twice; once released, all blocks are back."""
    params = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)
    prompts = {"a": SHARED[:40] + own(5, 1), "b": SHARED[:40] + own(9, 2)}
    reference = make_engine(tiny_model_dir, prefix_cache=False)
    expected = {rid: run(reference, p, rid, params) for rid, p in prompts.items()}
    prefill = make_engine(tiny_model_dir, prefill_only=True)
    decode = make_engine(tiny_model_dir)
    first: dict[str, int] = {}
    for rid, prompt in prompts.items():
        prefill.add_request(prompt, params, request_id=rid)
        first |= {out.request_id: out.token_id for out in prefill.step()}
        check_blocks(prefill)
    assert prefill.last_step.cached_tokens == (32,)  # b's prefill read a's parked blocks
    assert set(prefill.scheduler.parked) == {"a", "b"}
    for rid in prompts:
        seq = prefill.sequence(rid)
        first_block, kv = prefill.export_kv(rid)
        decode.import_sequence(rid, seq.prompt_token_ids, [first[rid]], params, seq.seed, kv, first_block)
        prefill.release(rid)
        check_blocks(decode)
    a, b = decode.sequence("a"), decode.sequence("b")
    assert a.block_table[:2] == b.block_table[:2]  # b's copy of the prefix was not needed
    assert_all_released(prefill)
    assert prefill.kv_cache.allocator.num_cached == 3  # a's two blocks and b's third
    tokens: dict[str, list[int]] = {rid: [first[rid]] for rid in prompts}
    while decode.has_unfinished():
        for out in decode.step():
            tokens[out.request_id].append(out.token_id)
        check_blocks(decode)
    assert tokens == expected
    assert_all_released(decode)


def test_cached_prefix_tokens_and_the_digest(tiny_model_dir: Path) -> None:
    engine = make_engine(tiny_model_dir)
    prompt = SHARED[:50]
    assert engine.cached_prefix_tokens(prompt) == 0
    run(engine, prompt, "r")  # 55 tokens written: 3 full blocks
    assert engine.cached_prefix_tokens(prompt) == 48
    assert engine.cached_prefix_tokens(SHARED[:20] + own(30, 1)) == 16
    digest = engine.prefix_digest()
    assert digest.cached_prefix_tokens(prompt) == 48 and len(digest.hashes) == 3
    assert digest.hashes == set(chain_hashes(digest.root, prompt, 16))
    assert engine.prefix_digest(limit=1).hashes == {chain_hashes(digest.root, prompt, 16)[0]}  # heads kept longest
    off = make_engine(tiny_model_dir, prefix_cache=False)
    run(off, prompt, "r")
    assert off.cached_prefix_tokens(prompt) == 0 and not off.prefix_digest().hashes


def test_parallel_samples_of_one_prompt_compute_it_once(tiny_model_dir: Path) -> None:
    """n samples of a 40-token prompt queued together: its two reusable full blocks are computed by the first
    sample only (the others wait one step and read them), and every sample still draws its own tokens."""
    engine = make_engine(tiny_model_dir)
    prompt = SHARED[:40]
    samples = [engine.add_request(prompt, SAMPLED, request_id=f"s-{i}", seed=100 + i) for i in range(3)]
    computed = 0
    while engine.has_unfinished():
        engine.step()
        if engine.last_step is not None and engine.last_step.phase is Phase.PREFILL:
            computed += engine.last_step.num_tokens
    assert computed == 40 + 2 * (40 - 32)
    alone = make_engine(tiny_model_dir)
    assert [s.output_token_ids for s in samples] == [_alone(alone, prompt, 100 + i) for i in range(3)]


def _alone(engine: LLMEngine, prompt: list[int], seed: int) -> list[int]:
    seq = engine.add_request(prompt, SAMPLED, request_id=f"alone-{seed}", seed=seed)
    while engine.has_unfinished():
        engine.step()
    return seq.output_token_ids
