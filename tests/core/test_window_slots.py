"""Windowed layers that keep their K/V apart from global ones (engine/core/window_slots.py, window_holds.py): a
slot is held while some window covers its block and kept spare only while the block is cached; the scheduler
holds a bounded window per sequence, cuts a prefill chunk where slots run out and preempts a decode for a slot;
the pool reads and writes every layer's K/V through the slots; and a real hybrid model (tiny Gemma 3) decodes
what transformers does to 4x its window while its windowed K/V stays bounded and its blocks grow — with and
without the prefix cache, in deterministic mode, prefilled in chunks, through a checkpoint and through a KV
tier; so does Qwen2 windowed from `max_window_layers` on."""

from pathlib import Path

import pytest
import torch

from fleetctl.engine.checkpoint.snapshot import restore_with_kv, snapshot
from fleetctl.engine.core.block_allocator import blocks_for
from fleetctl.engine.core.block_manager import BlockManager
from fleetctl.engine.core.engine_settings import EngineConfig, EngineSettings, OffloadPolicy
from fleetctl.engine.core.kv_cache import KVCache, KVCacheSpec
from fleetctl.engine.core.kv_window import KVWindow
from fleetctl.engine.core.llm_engine import LLMEngine
from fleetctl.engine.core.scheduler import Scheduler, SchedulerConfig
from fleetctl.engine.core.sequence import SamplingParams, Sequence
from fleetctl.engine.core.window_slots import NO_SLOT, WindowSlots
from fleetctl.tests.support.family_models import WINDOW, reference_greedy, write_family_model

BLOCK = 16
GROWN = 4 * WINDOW
PROMPT = [(5 * i + 7) % 300 + 3 for i in range(WINDOW + 9)]
LIVE_BOUND = blocks_for(WINDOW, BLOCK) + 2  # window slots a sequence holds at most (its window, the block written)
APART = KVWindow(WINDOW, BLOCK, apart=True)


def test_a_slot_goes_back_with_its_last_holder_unless_its_block_is_cached() -> None:
    slots = WindowSlots(2)
    first = slots.hold(7)
    assert slots.hold(7) == first and slots.num_free == 1  # two sequences' windows cover block 7: one slot
    slots.release(7, keep=False)
    assert slots.slot(7) == first  # one holder left
    slots.release(7, keep=False)
    assert slots.slot(7) == NO_SLOT and slots.num_free == 2
    slots.hold(3)
    slots.hold(4)
    slots.release(3, keep=True)  # cached: kept spare for a later prompt
    assert slots.spare() == 1 and slots.num_held == 1 and slots.spare(excluding=[3]) == 0
    with pytest.raises(ValueError, match="still held"):
        slots.drop(4)
    assert slots.oldest_spare() == 3
    slots.drop(3)
    assert slots.slot(3) == NO_SLOT and slots.num_free == 1


def decode_to(scheduler: Scheduler, seqs: list[Sequence], length: int, held: list[int]) -> None:
    """Run the scheduler's steps (the runner's part made up here) until every sequence of `seqs` that was not
    preempted holds `length` tokens, noting the window slots held after each step."""
    window = scheduler.allocator.window
    assert window is not None
    while any(seq.num_tokens < length for seq in seqs):
        step = scheduler.schedule()
        assert step is not None
        for i, seq in enumerate(step.seqs):
            completes = step.completes(i)
            seq.num_cached_tokens += step.chunks[i]
            if completes:
                seq.append_token(len(seq.output_token_ids) % 50)
        held.append(window.num_held)


def test_a_growing_sequence_holds_a_bounded_window_and_keeps_every_block() -> None:
    manager = BlockManager(64, BLOCK, window_slots=16)
    scheduler = Scheduler(SchedulerConfig(BLOCK, kv_window=APART), manager)
    seq = Sequence(list(PROMPT), SamplingParams(max_tokens=1000))
    scheduler.add(seq)
    held: list[int] = []
    decode_to(scheduler, [seq], len(PROMPT) + GROWN, held)
    assert max(held) <= LIVE_BOUND and held[-1] < held[0] + 1
    assert manager.num_used == len(seq.block_table) == blocks_for(seq.num_cached_tokens, BLOCK)  # global layers
    first_held = APART.passed_blocks(seq.num_cached_tokens)
    assert seq.window_table[:first_held] == [NO_SLOT] * first_held and NO_SLOT not in seq.window_table[first_held:]
    scheduler.finish(seq)
    assert manager.num_used == 0 and manager.window is not None and manager.window.num_free == 16


def test_a_prompt_longer_than_the_slots_is_prefilled_a_chunk_at_a_time() -> None:
    manager = BlockManager(64, BLOCK, window_slots=LIVE_BOUND + 2)
    scheduler = Scheduler(SchedulerConfig(BLOCK, kv_window=APART), manager)
    prompt = [(3 * i) % 200 + 3 for i in range(12 * BLOCK + 5)]  # 13 blocks: twice the slots
    seq = Sequence(prompt, SamplingParams(max_tokens=1))
    scheduler.add(seq)
    chunks = []
    while not seq.output_token_ids:
        step = scheduler.schedule()
        assert step is not None and manager.window is not None and manager.window.num_free >= 0
        chunks.append(step.chunks[0])
        completes = step.completes(0)
        seq.num_cached_tokens += step.chunks[0]
        if completes:
            seq.append_token(1)
    assert sum(chunks) == len(prompt) and len(chunks) > 2 and chunks[0] == (LIVE_BOUND + 2) * BLOCK


def test_a_decode_short_of_a_window_slot_preempts_the_newest_sequence() -> None:
    manager = BlockManager(64, BLOCK, window_slots=LIVE_BOUND)
    scheduler = Scheduler(SchedulerConfig(BLOCK, kv_window=APART), manager)
    seqs = [Sequence(list(PROMPT), SamplingParams(max_tokens=1000)) for _ in range(2)]
    for seq in seqs:
        scheduler.add(seq)
    held: list[int] = []
    decode_to(scheduler, seqs[:1], len(PROMPT) + GROWN, held)
    assert scheduler.num_preemptions > 0 and max(held) <= LIVE_BOUND
    assert seqs[0].num_tokens >= len(PROMPT) + GROWN  # the oldest went on; the newest waited for slots


def test_the_pool_reads_and_writes_every_layer_through_the_window_slots() -> None:
    spec = KVCacheSpec(num_layers=3, num_kv_heads=2, head_dim=4, dtype=torch.float32, windowed_layers=(0, 2))
    cache = KVCache(spec, num_blocks=8, device=torch.device("cpu"), window_slots=2)
    assert cache.tensor.shape[0] == 1 and cache.window_tensor.shape[:3] == (2, 2, 2)
    cache.allocator.allocate(3)
    cache.allocator.hold_window([1, 2])  # block 0: its window passed
    kv = torch.randn(3, 2, 3, BLOCK, 2, 4)
    cache.write_blocks([0, 1, 2], kv)
    back = cache.read_blocks([0, 1, 2])
    assert torch.equal(back[1], kv[1])  # the global layer: every block
    assert torch.equal(back[[0, 2]][:, :, 1:], kv[[0, 2]][:, :, 1:])  # windowed layers: the slotted blocks
    assert not back[[0, 2]][:, :, 0].any() and not cache.has_window(0) and cache.has_window(1)
    assert torch.equal(cache.layers[2][:, cache.allocator.window.slot(2)], kv[2, :, 2])


# ---- a real hybrid model ------------------------------------------------------------------------------------

GREEDY = SamplingParams(max_tokens=GROWN + 8, temperature=0.0, ignore_eos=True)


def hybrid_engine(model_dir: Path, **settings: object) -> LLMEngine:
    options: dict = {"dtype": "float32", "num_kv_blocks": 64} | settings
    return LLMEngine(EngineConfig(model_dir=model_dir, settings=EngineSettings(**options)))


@pytest.fixture(scope="module")
def expected(family_model_dirs: dict[str, Path]) -> list[int]:
    return reference_greedy(family_model_dirs["gemma3"], PROMPT, GREEDY.max_tokens)


def run_watching_slots(engine: LLMEngine) -> int:
    """Step `engine` until it is done; returns the most window slots held after any step."""
    window = engine.kv_cache.allocator.window
    assert window is not None
    peak = 0
    while engine.has_unfinished():
        engine.step()
        peak = max(peak, window.num_held)
    return peak


@pytest.mark.parametrize("settings", [{}, {"prefix_cache": True}, {"deterministic": True}],
                         ids=["plain", "prefix-cache", "deterministic"])
def test_gemma3_decodes_transformers_tokens_with_its_windowed_kv_bounded(
        settings: dict, family_model_dirs: dict[str, Path], expected: list[int]) -> None:
    engine = hybrid_engine(family_model_dirs["gemma3"], **settings)
    assert engine.kv_window is not None and engine.kv_window.apart
    seq = engine.add_request(PROMPT, GREEDY)
    peak = run_watching_slots(engine)
    assert seq.output_token_ids == expected
    assert peak <= LIVE_BOUND + (engine.kv_window.query_tile > 1)  # deterministic tiles keep one block more
    if settings.get("prefix_cache"):  # its blocks stay cached, and the same prompt reuses them
        again = engine.add_request(PROMPT, GREEDY)
        engine.step()
        assert engine.last_step is not None and engine.last_step.cached_tokens[0] > 0
        run_watching_slots(engine)
        assert again.output_token_ids == expected


def test_a_gemma3_prompt_prefilled_in_chunks_gives_back_slots_between_them(
        family_model_dirs: dict[str, Path]) -> None:
    model_dir = family_model_dirs["gemma3"]
    prompt = [(3 * i + 1) % 300 + 3 for i in range(4 * WINDOW)]
    engine = hybrid_engine(model_dir, max_num_batched_tokens=8)  # 12 chunks: the window passes blocks among them
    seq = engine.add_request(prompt, SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True))
    released_in_prefill = False
    while not seq.output_token_ids:
        engine.step()
        released_in_prefill |= seq.window_table[0] == NO_SLOT
    run_watching_slots(engine)
    assert released_in_prefill and seq.output_token_ids == reference_greedy(model_dir, prompt, 8)


@pytest.mark.parametrize("deterministic", [False, True], ids=["fast", "deterministic"])
def test_qwen2_windowed_from_max_window_layers_keeps_those_layers_apart(deterministic: bool, tmp_path: Path) -> None:
    model_dir = write_family_model("qwen2", tmp_path, use_sliding_window=True, sliding_window=WINDOW,
                                   max_window_layers=2)  # layers 0-1 global, 2-3 windowed
    engine = hybrid_engine(model_dir, deterministic=deterministic, prefix_cache=True)
    assert engine.kv_cache.spec.windowed_layers == (2, 3)
    seq = engine.add_request(PROMPT, GREEDY)
    assert run_watching_slots(engine) <= LIVE_BOUND + deterministic
    assert seq.output_token_ids == reference_greedy(model_dir, PROMPT, GREEDY.max_tokens)


def test_a_gemma3_checkpoint_restores_into_a_fresh_engine_and_decodes_on(
        family_model_dirs: dict[str, Path], expected: list[int]) -> None:
    model_dir = family_model_dirs["gemma3"]
    source = hybrid_engine(model_dir)
    seq = source.add_request(PROMPT, GREEDY)
    while len(seq.output_token_ids) < 2 * WINDOW:  # past its window: the prompt's windowed K/V is gone
        source.step()
    records, kv = snapshot(source)
    restored = hybrid_engine(model_dir)
    restore_with_kv(restored, records, kv)
    moved = restored.sequence(seq.request_id)
    assert moved is not None
    run_watching_slots(restored)
    assert moved.output_token_ids == expected


@pytest.mark.parametrize("policy", list(OffloadPolicy))
def test_gemma3_blocks_kept_in_a_kv_tier_serve_a_fresh_engine(
        policy: OffloadPolicy, family_model_dirs: dict[str, Path], expected: list[int], tmp_path: Path) -> None:
    # few window slots (2 windows and a 64-token chunk: 10), so slots are reclaimed long before blocks
    tiers = {"prefix_cache": True, "kv_offload_memory_bytes": 1 << 24, "kv_offload_host_dir": tmp_path / "host",
             "kv_offload_policy": policy, "max_num_seqs": 2, "max_num_batched_tokens": 64}
    first = hybrid_engine(family_model_dirs["gemma3"], **tiers)
    assert first.kv_cache.allocator.window is not None and first.kv_cache.allocator.window.num_slots == 10
    first.add_request(PROMPT, GREEDY)
    run_watching_slots(first)
    for prompt in ([(11 * i + n) % 300 + 3 for i in range(3 * WINDOW)] for n in range(20)):  # pressure: evict
        first.add_request(prompt, SamplingParams(max_tokens=2, temperature=0.0, ignore_eos=True))
        run_watching_slots(first)
    assert first.offload is not None
    first.offload.tiers.flush()
    fresh = hybrid_engine(family_model_dirs["gemma3"], **tiers)  # a restarted worker: an empty pool
    seq = fresh.add_request(PROMPT, GREEDY)
    run_watching_slots(fresh)
    assert seq.output_token_ids == expected
    assert fresh.offload is not None and fresh.offload.hits["host"] > 0  # blocks read back, every layer's K/V


def check_holds(scheduler: Scheduler, step_seqs: list[Sequence], chunks: list[int]) -> None:
    """Every slot a sequence lists is its block's and counted once per holder; a step's sequences hold every
    block from their window's start to the last one the step writes; nothing else is held."""
    manager = scheduler.allocator
    window = manager.window
    assert window is not None
    holders: dict[int, int] = {}
    for seq in [*scheduler.running, *scheduler.prefilling, *scheduler.parked.values()]:
        for block, slot in zip(seq.block_table, seq.window_table, strict=False):
            if slot != NO_SLOT:
                assert window.slot(block) == slot
                holders[block] = holders.get(block, 0) + 1
    assert holders == window._holders
    for seq, chunk in zip(step_seqs, chunks, strict=True):
        first = APART.passed_blocks(seq.num_cached_tokens)
        written = blocks_for(seq.num_cached_tokens + chunk, BLOCK)
        assert NO_SLOT not in seq.window_table[first:written]


@pytest.mark.parametrize("seed", range(4))
def test_window_holds_stay_consistent_through_shared_prefixes_preemption_and_ends(seed: int) -> None:
    import random

    rng = random.Random(seed)
    manager = BlockManager(32, BLOCK, root=b"salt", window_slots=9)
    scheduler = Scheduler(SchedulerConfig(BLOCK, max_num_seqs=4, max_num_batched_tokens=80, kv_window=APART),
                          manager)
    prefixes = [[(13 * i + p) % 300 + 3 for i in range(40)] for p in range(3)]  # shared system prompts
    seqs = []
    for _ in range(24):
        prompt = rng.choice(prefixes)[: rng.randrange(20, 41)] + [rng.randrange(3, 300)
                                                                  for _ in range(rng.randrange(1, 30))]
        seqs.append(Sequence(prompt, SamplingParams(max_tokens=rng.randrange(1, 60))))
    pending = list(seqs)
    hits = 0
    while pending or scheduler.has_unfinished():
        if pending and rng.random() < 0.5:
            scheduler.add(pending.pop(0))
        step = scheduler.schedule()
        if step is None:
            continue
        check_holds(scheduler, step.seqs, step.chunks)
        hits += sum(step.cache_hits)
        for i, seq in enumerate(step.seqs):
            completes, written_from = step.completes(i), seq.num_cached_tokens
            seq.num_cached_tokens += step.chunks[i]
            manager.cache_full_blocks(seq, written_from)
            if completes:
                seq.append_token(rng.randrange(3, 300))
                if len(seq.output_token_ids) >= seq.params.max_tokens:
                    scheduler.finish(seq)
    assert scheduler.num_preemptions > 0  # the pool was short: some sequence was preempted and recomputed
    assert hits > 0  # and prompts reused cached blocks (those within their window with the slots kept spare)
    window = manager.window
    assert window is not None and window.num_held == 0 and not window._holders
    assert all(block in manager._cached for block in window._spare)  # only cached blocks keep a slot
    assert window.num_free + window.spare() == window.num_slots
