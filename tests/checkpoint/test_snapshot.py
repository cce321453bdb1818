"""In-process KV movement between engines: the handoff path (export → import) and checkpoint
snapshots (snapshot → restore_with_kv / cold_start). Token identity relies on deterministic=True."""

from pathlib import Path

from fleetctl.engine.checkpoint.snapshot import cold_start, restore_with_kv, snapshot
from fleetctl.engine.core.block_allocator import blocks_for
from fleetctl.engine.core.engine_settings import EngineConfig, EngineSettings
from fleetctl.engine.core.llm_engine import LLMEngine
from fleetctl.engine.core.sequence import SamplingParams
from fleetctl.tests.support.family_models import WINDOW

PROMPTS = ["The quick brown fox", "Once upon a time there was a small model that served", "def add(a, b):"]
PARAMS = SamplingParams(max_tokens=30, temperature=0.0, ignore_eos=True)
SAMPLED = SamplingParams(max_tokens=30, temperature=0.9, top_p=0.95, seed=5, ignore_eos=True)


def engine(model_dir: Path, **kw: object) -> LLMEngine:
    settings = EngineSettings(dtype="float32", deterministic=True, num_kv_blocks=64)
    return LLMEngine(EngineConfig(model_dir=model_dir, settings=settings, **kw))


def run_all(eng: LLMEngine) -> dict[str, list[int]]:
    tokens: dict[str, list[int]] = {}
    while eng.has_unfinished():
        for out in eng.step():
            tokens.setdefault(out.request_id, []).append(out.token_id)
    return tokens


def test_prefill_handoff_to_decode_engine_matches_single_engine(tiny_model_dir: Path) -> None:
    reference = engine(tiny_model_dir).generate(PROMPTS, PARAMS)
    prefill = engine(tiny_model_dir, prefill_only=True)
    decode = engine(tiny_model_dir)
    for i, prompt in enumerate(PROMPTS):
        prefill.add_request(prompt, PARAMS, request_id=f"r{i}")
    first = {out.request_id: out.token_id for out in prefill.step()}
    assert not prefill.scheduler.running and len(prefill.scheduler.parked) == 3
    for rid, token in first.items():
        seq = prefill.sequence(rid)
        first_block, kv = prefill.export_kv(rid)
        decode.import_sequence(rid, seq.prompt_token_ids, [token], PARAMS, seq.seed, kv, first_block)
        prefill.release(rid)
    assert prefill.kv_cache.allocator.num_used == 0
    rest = run_all(decode)
    for i, ref in enumerate(reference):
        assert [first[f"r{i}"], *rest[f"r{i}"]] == ref.token_ids


def test_snapshot_restore_continues_token_identically(tiny_model_dir: Path) -> None:
    alone = engine(tiny_model_dir)
    expected = {f"g{i}": r.token_ids for i, r in enumerate(alone.generate(PROMPTS, PARAMS))}
    expected["s0"] = alone.generate([PROMPTS[0]], SAMPLED)[0].token_ids
    source = engine(tiny_model_dir)
    for i, prompt in enumerate(PROMPTS):
        source.add_request(prompt, PARAMS, request_id=f"g{i}")
    source.add_request(PROMPTS[0], SAMPLED, request_id="s0", session="agent-7")
    before = {}
    for _ in range(7):
        for out in source.step():
            before.setdefault(out.request_id, []).append(out.token_id)
    records, kv = snapshot(source)
    assert kv.shape[2] == sum(len(r.block_table) for r in records)
    for restore in (restore_with_kv, None):
        target = engine(tiny_model_dir)
        if restore is None:
            cold_start(target, records)
        else:
            restore(target, records, kv)
        assert target._seqs["s0"].session == "agent-7" and target._seqs["g0"].session == ""
        after = run_all(target)
        for rid, tokens in expected.items():
            assert before[rid] + after[rid] == tokens, (rid, restore)


def test_sessions_sharing_a_cached_prefix_are_saved_and_restored_sharing_it(tiny_model_dir: Path) -> None:
    """The shared blocks are saved once and restored once (both sessions point at the same pool blocks
    again), the sessions continue token-identically, and every block comes back afterwards."""
    shared = [(11 * i + 5) % 300 + 3 for i in range(40)]
    prompts = {"a": [*shared, 7, 8, 9], "b": [*shared, 20, 21, 22, 23, 24]}
    expected = {rid: engine(tiny_model_dir).generate([p], PARAMS)[0].token_ids for rid, p in prompts.items()}
    source = engine(tiny_model_dir)
    before: dict[str, list[int]] = {}
    for rid, prompt in prompts.items():  # one prefill step each: b reads a's first two blocks
        source.add_request(prompt, PARAMS, request_id=rid)
        for out in source.step():
            before.setdefault(out.request_id, []).append(out.token_id)
    for _ in range(3):
        for out in source.step():
            before[out.request_id].append(out.token_id)
    assert source.sequence("a").block_table[:2] == source.sequence("b").block_table[:2]
    records, kv = snapshot(source)
    tables = {r.request_id: r.block_table for r in records}
    assert tables["a"][:2] == tables["b"][:2]
    assert kv.shape[2] == len({b for table in tables.values() for b in table}) == sum(map(len, tables.values())) - 2
    for prefix_cache in (True, False):
        settings = EngineSettings(dtype="float32", deterministic=True, num_kv_blocks=64, prefix_cache=prefix_cache)
        target = LLMEngine(EngineConfig(model_dir=tiny_model_dir, settings=settings))
        restore_with_kv(target, records, kv)
        a, b = target.sequence("a"), target.sequence("b")
        assert (a.block_table[:2] == b.block_table[:2]) is prefix_cache  # without a cache: two copies
        after = run_all(target)
        assert {rid: before[rid] + after[rid] for rid in prompts} == expected
        manager = target.kv_cache.allocator
        assert manager.num_used == 0 and manager.num_free == manager.num_blocks
    for rid in prompts:
        source.release(rid)
    assert source.kv_cache.allocator.num_used == 0


def test_a_windowed_session_saves_only_the_blocks_its_window_holds(family_model_dirs: dict[str, Path]) -> None:
    """Tiny Mistral (every layer windowed): a session decoded well past its window is saved from its first
    block not dropped, restored into that many blocks, and continues token-identically."""
    model_dir = family_model_dirs["mistral"]
    prompt = [(5 * i + 7) % 300 + 3 for i in range(3 * WINDOW)]
    params = SamplingParams(max_tokens=2 * WINDOW, temperature=0.0, ignore_eos=True)
    expected = engine(model_dir).generate([prompt], params)[0].token_ids
    source = engine(model_dir)
    source.add_request(prompt, params, request_id="w")
    before = [out.token_id for _ in range(WINDOW) for out in source.step()]
    records, kv = snapshot(source)
    (record,) = records
    assert record.first_block > 0 and kv.shape[2] == len(record.block_table)
    assert record.first_block + len(record.block_table) == blocks_for(record.num_cached_tokens, 16)
    target = engine(model_dir)
    restore_with_kv(target, records, kv)
    assert target.kv_cache.allocator.num_used == len(record.block_table)
    assert before + run_all(target)["w"] == expected
