"""Dropping the KV blocks every layer's sliding window has passed (engine/core/kv_window.py): the rule leaves
every key a later step reads, the scheduler frees each block once and keeps a growing sequence's blocks
bounded, and a real windowed model (tiny Mistral) decodes what transformers does while its pool usage stays
flat — with and without the prefix cache, in deterministic mode, and across a KV handoff between engines."""

from pathlib import Path

import pytest

from fleetctl.engine.core.block_allocator import blocks_for
from fleetctl.engine.core.block_manager import BlockManager
from fleetctl.engine.core.engine_settings import EngineConfig, EngineSettings
from fleetctl.engine.core.kv_window import DROPPED_BLOCK, KVWindow
from fleetctl.engine.core.llm_engine import LLMEngine
from fleetctl.engine.core.scheduler import Scheduler, SchedulerConfig
from fleetctl.engine.core.sequence import SamplingParams, Sequence
from fleetctl.kernels.batch_invariant import TILE
from fleetctl.kernels.paged_attention import window_start
from fleetctl.tests.support.family_models import WINDOW, reference_greedy

BLOCK = 16
GROWN = 4 * WINDOW  # the tests grow one sequence to 4x its window, and past it
PROMPT = [(5 * i + 7) % 300 + 3 for i in range(WINDOW + 9)]
# blocks a windowed sequence holds at most: its window, the block being written, and (tiles) one more
LIVE_BOUND = blocks_for(WINDOW, BLOCK) + 2


@pytest.mark.parametrize("tile", [1, TILE])
@pytest.mark.parametrize("window", [1, 15, 16, 24, 33])
def test_the_blocks_passed_are_exactly_those_no_later_query_reads(window: int, tile: int) -> None:
    rule = KVWindow(window, BLOCK, tile)
    for first_query in range(400):
        # the first key any query from here on reads: deterministic attention starts a tile at its first row's
        first_key = min(window_start(p // tile * tile, window) for p in range(first_query, first_query + 2 * tile))
        passed = rule.passed_blocks(first_query)
        assert passed * BLOCK <= first_key < (passed + 1) * BLOCK


def decode_to(scheduler: Scheduler, seq: Sequence, length: int, peak: list[int]) -> None:
    """Run `seq` through the scheduler's steps until it holds `length` tokens (each step's token is made up
    here: the runner's part), noting the blocks in use after every step."""
    while seq.num_tokens < length:
        step = scheduler.schedule()
        assert step is not None and step.seqs == [seq]
        seq.num_cached_tokens += step.chunks[0]
        if step.completes(0):
            seq.append_token(len(seq.output_token_ids) % 50)
        peak.append(scheduler.allocator.num_used)


@pytest.mark.parametrize("tile", [1, TILE])
def test_a_growing_sequence_holds_its_window_and_frees_each_block_once(tile: int) -> None:
    manager = BlockManager(64, BLOCK)
    rule = KVWindow(WINDOW, BLOCK, tile)
    scheduler = Scheduler(SchedulerConfig(BLOCK, kv_window=rule), manager)
    seq = Sequence(list(PROMPT), SamplingParams(max_tokens=1000))
    scheduler.add(seq)
    used: list[int] = []
    decode_to(scheduler, seq, len(PROMPT) + GROWN, used)
    assert max(used) <= LIVE_BOUND
    assert seq.num_dropped_blocks == rule.passed_blocks(seq.num_cached_tokens - 1) > 0  # as of its last step
    assert seq.block_table[: seq.num_dropped_blocks] == [DROPPED_BLOCK] * seq.num_dropped_blocks
    assert DROPPED_BLOCK not in seq.block_table[seq.num_dropped_blocks :]
    scheduler.finish(seq)  # frees only the live blocks: a dropped one freed again would raise
    assert manager.num_used == 0 and manager.num_free == 64


def test_without_a_window_the_sequence_keeps_every_block() -> None:
    scheduler = Scheduler(SchedulerConfig(BLOCK), BlockManager(64, BLOCK))
    seq = Sequence(list(PROMPT), SamplingParams(max_tokens=1000))
    scheduler.add(seq)
    used: list[int] = []
    decode_to(scheduler, seq, len(PROMPT) + GROWN, used)
    assert used[-1] == blocks_for(seq.num_cached_tokens, BLOCK) and seq.num_dropped_blocks == 0


def test_a_preempted_windowed_sequence_is_recomputed_from_a_whole_table() -> None:
    manager = BlockManager(64, BLOCK)
    scheduler = Scheduler(SchedulerConfig(BLOCK, kv_window=KVWindow(WINDOW, BLOCK)), manager)
    seq = Sequence(list(PROMPT), SamplingParams(max_tokens=1000))
    scheduler.add(seq)
    decode_to(scheduler, seq, len(PROMPT) + GROWN, [])
    assert seq.num_dropped_blocks > 0
    scheduler._preempt(seq)
    assert manager.num_used == 0 and seq.num_dropped_blocks == 0 and seq.block_table == []
    step = scheduler.schedule()  # its prompt and output prefilled again, from block 0
    assert step is not None and step.chunks == [seq.num_tokens]
    assert len(seq.block_table) == blocks_for(seq.num_tokens, BLOCK) and DROPPED_BLOCK not in seq.block_table


# ---- a real windowed model ---------------------------------------------------------------------------------

GREEDY = SamplingParams(max_tokens=GROWN + 8, temperature=0.0, ignore_eos=True)


def mistral_engine(model_dir: Path, prefill_only: bool = False, **settings: object) -> LLMEngine:
    options: dict = {"dtype": "float32", "num_kv_blocks": 64} | settings
    return LLMEngine(EngineConfig(model_dir=model_dir, settings=EngineSettings(**options), prefill_only=prefill_only))


@pytest.fixture(scope="module")
def expected(family_model_dirs: dict[str, Path]) -> list[int]:
    return reference_greedy(family_model_dirs["mistral"], PROMPT, GREEDY.max_tokens)


def run_watching_blocks(engine: LLMEngine, seq: Sequence) -> int:
    """Step `engine` until `seq` ends; returns the most blocks in use after any step."""
    peak = 0
    while engine.has_unfinished():
        engine.step()
        peak = max(peak, engine.kv_cache.allocator.num_used)
    assert seq.finish_reason is not None
    return peak


@pytest.mark.parametrize("settings", [{}, {"prefix_cache": True}, {"deterministic": True}],
                         ids=["plain", "prefix-cache", "deterministic"])
def test_mistral_decodes_transformers_tokens_in_a_bounded_number_of_blocks(
        settings: dict, family_model_dirs: dict[str, Path], expected: list[int]) -> None:
    engine = mistral_engine(family_model_dirs["mistral"], **settings)
    assert engine.kv_window is not None and engine.kv_window.tokens == WINDOW
    seq = engine.add_request(PROMPT, GREEDY)
    peak = run_watching_blocks(engine, seq)
    assert seq.output_token_ids == expected
    assert seq.num_tokens >= len(PROMPT) + GROWN and peak <= LIVE_BOUND
    assert engine.kv_cache.allocator.num_used == 0
    if settings.get("prefix_cache"):  # the same prompt again: its cached blocks the window dropped still serve
        again = engine.add_request(PROMPT, GREEDY, request_id="again")
        run_watching_blocks(engine, again)
        assert again.output_token_ids == expected


def test_a_handed_off_windowed_sequence_sends_and_holds_only_its_live_blocks(
        family_model_dirs: dict[str, Path], expected: list[int]) -> None:
    model_dir = family_model_dirs["mistral"]
    long_prompt = PROMPT + expected[:GROWN]  # prefilled in chunks: the prefill engine drops as it goes
    prefill = mistral_engine(model_dir, prefill_only=True, max_num_batched_tokens=WINDOW)
    seq = prefill.add_request(long_prompt, SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True))
    while seq.request_id not in prefill.scheduler.parked:
        prefill.step()
    first_block, kv = prefill.export_kv(seq.request_id)
    assert first_block > 0 and first_block + kv.shape[2] == blocks_for(len(long_prompt), BLOCK)
    assert prefill.kv_cache.allocator.num_used == kv.shape[2]  # the blocks it dropped are free again
    decode = mistral_engine(model_dir)
    moved = decode.import_sequence(seq.request_id, seq.prompt_token_ids, list(seq.output_token_ids),
                                   seq.params, seq.seed, kv, first_block)
    assert decode.kv_cache.allocator.num_used <= LIVE_BOUND
    run_watching_blocks(decode, moved)
    assert moved.output_token_ids == expected[GROWN : GROWN + 8]
