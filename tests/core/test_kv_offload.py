"""An engine over the node-wide KV tiers (`kv_offload`): the blocks its pool reclaims are kept in the host tier
(and what that evicts, on disk); a prompt whose prefix left the pool is read back from whichever tier holds it;
and in deterministic mode every logit of it is bit-identical to computing it, from host, from disk and after a
corrupted record (a miss: computed again). Write-through puts each block in the tiers as soon as it is full: a
fresh engine (a restarted worker) finds the whole cache of the one before it. A read runs beside the steps: a
sequence decoding on the engine goes on while a slow tier reads another prompt's prefix."""

import threading
import time
from pathlib import Path

import pytest
import torch
from test_batch_invariance import recorded_logits

from fleetctl.engine.core.engine_settings import EngineConfig, EngineSettings, KVDtype, OffloadPolicy
from fleetctl.engine.core.kv_tiers import file_tier
from fleetctl.engine.core.llm_engine import LLMEngine
from fleetctl.engine.core.sequence import SamplingParams, SequenceStatus

GREEDY = SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True)
PROMPT = [(7 * i) % 300 + 3 for i in range(90)]  # 5 full blocks of 16 and 10 tokens more
OTHERS = [[(11 * i + 13 * n) % 300 + 3 for i in range(90)] for n in range(1, 4)]


def make_engine(model_dir: Path, tmp_path: Path, host_bytes: int, disk_bytes: int,
                prefix_cache: bool = True, policy: OffloadPolicy = OffloadPolicy.EVICT,
                kv_dtype: KVDtype = KVDtype.AUTO) -> LLMEngine:
    settings = EngineSettings(dtype="float32", deterministic=True, num_kv_blocks=8, prefix_cache=prefix_cache,
                              kv_dtype=kv_dtype,
                              kv_offload_memory_bytes=host_bytes, kv_offload_host_dir=tmp_path / "host",
                              kv_offload_dir=tmp_path / "disk" if disk_bytes else None,
                              kv_offload_disk_bytes=disk_bytes, kv_offload_policy=policy)
    return LLMEngine(EngineConfig(model_dir=model_dir, settings=settings))


def run(engine: LLMEngine, prompt: list[int]) -> tuple[torch.Tensor, int, dict[str, int]]:
    """Every logits row of `prompt`'s answer [tokens, vocab], the prompt tokens its prefill took from the pool's
    cache (where blocks read back from a tier are), and of those what each tier served, as its step reported."""
    with recorded_logits() as rows:
        seq = engine.add_request(prompt, GREEDY)
        while seq.status is SequenceStatus.WAITING:  # its prefix may be coming off a tier still
            engine.step()
        assert engine.last_step is not None
        hit = engine.last_step.cached_tokens[0]
        tiers = engine.last_step.tier_tokens.get(seq.request_id, {})
        while engine.has_unfinished():
            engine.step()
            assert engine.last_step is None or not engine.last_step.tier_tokens  # reported once
    return torch.stack([rows[key] for key in sorted(rows, key=lambda key: key[1])]), hit, tiers


def evict_prompt(engine: LLMEngine) -> None:
    """Other prompts through the 8-block pool: PROMPT's blocks are reclaimed (and offered to the tiers)."""
    for other in OTHERS:
        run(engine, other)
    assert engine.offload is not None
    engine.offload.tiers.flush()


@pytest.mark.parametrize("kv_dtype", list(KVDtype))  # an int8 pool's records: its 8-bit rows as they are
def test_a_prefix_read_back_from_host_or_disk_gives_the_computed_logits(tiny_model_dir: Path, tmp_path: Path,
                                                                        kv_dtype: KVDtype) -> None:
    computed, _, _ = run(make_engine(tiny_model_dir, tmp_path / "none", 0, 0, prefix_cache=False, kv_dtype=kv_dtype),
                         PROMPT)
    probe = make_engine(tiny_model_dir, tmp_path / "probe", 1 << 20, 0, kv_dtype=kv_dtype).kv_cache.tensor
    record_bytes = probe[:, :, 0].numel() * probe.element_size() + 1024
    engine = make_engine(tiny_model_dir, tmp_path, 6 * record_bytes, 64 * record_bytes, kv_dtype=kv_dtype)
    offload = engine.offload
    assert offload is not None
    host, disk = offload.tiers.tiers

    first, _, tiers = run(engine, PROMPT)
    assert torch.equal(first, computed) and tiers == {}
    evict_prompt(engine)
    from_tiers, hit, tiers = run(engine, PROMPT)
    assert sum(offload.hits.values()) == 5  # every full block before the last token's, read back
    assert hit == 80  # and the prefill took them: only the last 10 tokens were computed
    assert sum(tiers.values()) == 80 and set(tiers) <= {"host", "disk"} and tiers == {
        tier: 16 * blocks for tier, blocks in offload.hits.items()}
    assert torch.equal(from_tiers, computed)

    evict_prompt(engine)
    for path in host.root.glob("*.kvb"):  # the host tier lost: what it spilled is on disk
        path.unlink()
    offload.hits.clear()
    from_disk, hit, tiers = run(engine, PROMPT)
    assert offload.hits["disk"] >= 1 and hit == 16 * sum(offload.hits.values())
    assert tiers["disk"] == 16 * offload.hits["disk"] and sum(tiers.values()) == hit
    assert host.usage() <= host.max_bytes and disk.usage() <= disk.max_bytes
    assert torch.equal(from_disk, computed)


def test_a_corrupted_record_is_computed_again(tiny_model_dir: Path, tmp_path: Path) -> None:
    computed, _, _ = run(make_engine(tiny_model_dir, tmp_path / "none", 0, 0, prefix_cache=False), PROMPT)
    engine = make_engine(tiny_model_dir, tmp_path, 16 << 20, 0)
    offload = engine.offload
    assert offload is not None
    run(engine, PROMPT)
    evict_prompt(engine)
    [host] = offload.tiers.tiers
    for path in host.root.glob("*.kvb"):
        data = bytearray(path.read_bytes())
        data[-100] ^= 0xFF
        path.write_bytes(bytes(data))
    again, hit, tiers = run(engine, PROMPT)
    assert sum(offload.hits.values()) == 0 and host.stats.corrupt >= 1 and hit == 0 and tiers == {}
    assert torch.equal(again, computed)


def test_a_read_that_fails_is_a_miss_and_the_prompt_is_computed(tiny_model_dir: Path, tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch,
                                                                 capfd: pytest.CaptureFixture[str]) -> None:
    computed, _, _ = run(make_engine(tiny_model_dir, tmp_path / "none", 0, 0, prefix_cache=False), PROMPT)
    engine = make_engine(tiny_model_dir, tmp_path, 16 << 20, 0)
    run(engine, PROMPT)
    evict_prompt(engine)
    monkeypatch.setenv("FLEET_FAULTS", "tier-read=raise:disk gone")
    again, hit, tiers = run(engine, PROMPT)
    assert hit == 0 and tiers == {} and torch.equal(again, computed)
    assert "a KV tier read failed (disk gone): the prompt is computed" in capfd.readouterr().err


@pytest.mark.parametrize("policy", list(OffloadPolicy))
def test_write_through_leaves_the_cache_to_the_next_engine(tiny_model_dir: Path, tmp_path: Path,
                                                           policy: OffloadPolicy) -> None:
    computed, _, _ = run(make_engine(tiny_model_dir, tmp_path / "none", 0, 0, prefix_cache=False), PROMPT)
    before = make_engine(tiny_model_dir, tmp_path, 16 << 20, 0, policy=policy)
    run(before, PROMPT)  # nothing evicted: its pool holds the prompt
    assert before.offload is not None
    before.offload.tiers.flush()
    after = make_engine(tiny_model_dir, tmp_path, 16 << 20, 0, policy=policy)  # the worker restarted, say
    again, hit, tiers = run(after, PROMPT)
    if policy is OffloadPolicy.WRITE_THROUGH:
        assert hit == 80 and tiers == {"host": 80}
    else:
        assert hit == 0 and tiers == {}  # evict: only what a pool reclaims reaches the tiers
    assert torch.equal(again, computed)


def test_a_slow_tier_read_does_not_stall_the_sequences_decoding(tiny_model_dir: Path, tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    computed, _, _ = run(make_engine(tiny_model_dir, tmp_path / "none", 0, 0, prefix_cache=False), PROMPT)
    engine = make_engine(tiny_model_dir, tmp_path, 16 << 20, 0)
    run(engine, PROMPT)
    evict_prompt(engine)
    decoding = engine.add_request([5, 6, 7, 8, 9], SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True))
    while not decoding.output_token_ids:
        engine.step()
    released = threading.Event()

    def slow_disk(point: str, key: str = "") -> None:  # a tier that answers only once the test lets it
        if point == "tier-read":
            released.wait(timeout=30)

    monkeypatch.setattr(file_tier, "fault_point", slow_disk)
    started = time.perf_counter()
    with recorded_logits() as rows:
        waiting = engine.add_request(PROMPT, GREEDY)
        assert time.perf_counter() - started < 10  # the read runs beside the engine: adding does not wait for it
        decoded_while_reading = 0
        while decoded_while_reading < 8 and decoding.status is SequenceStatus.RUNNING:  # the read held: decode goes on
            assert waiting.status is SequenceStatus.WAITING and waiting.awaiting_tiers
            before = len(decoding.output_token_ids)
            engine.step()
            decoded_while_reading += len(decoding.output_token_ids) - before
        released.set()
        while waiting.status is SequenceStatus.WAITING:
            engine.step()
        assert engine.last_step is not None and engine.last_step.cached_tokens == (80,)
        while engine.has_unfinished():
            engine.step()
    mine = sorted((key for key in rows if key[0] == waiting.request_id), key=lambda key: key[1])
    assert torch.equal(torch.stack([rows[key] for key in mine]), computed)
