"""A checkpoint restored on a node whose KV tiers already hold its sessions' blocks (write-through: the worker
checkpointed wrote each block as it filled): the restored engine registers those blocks and finds them in the
store — none copied out of its pool or written again — and its sessions go on with the tokens the source makes."""

from pathlib import Path

from fleetctl.engine.checkpoint.snapshot import restore_with_kv, snapshot
from fleetctl.engine.core.engine_settings import EngineConfig, EngineSettings, OffloadPolicy
from fleetctl.engine.core.llm_engine import LLMEngine
from fleetctl.engine.core.sequence import SamplingParams

PROMPT = [(7 * i) % 300 + 3 for i in range(90)]  # 5 full blocks of 16 and 10 tokens more
GREEDY = SamplingParams(max_tokens=20, temperature=0.0, ignore_eos=True)


def write_through_engine(model_dir: Path, tiers: Path) -> LLMEngine:
    settings = EngineSettings(dtype="float32", deterministic=True, num_kv_blocks=16, prefix_cache=True,
                              kv_offload_memory_bytes=64 << 20, kv_offload_host_dir=tiers,
                              kv_offload_policy=OffloadPolicy.WRITE_THROUGH)
    return LLMEngine(EngineConfig(model_dir=model_dir, settings=settings))


def test_restored_blocks_the_store_holds_are_not_written_twice(tiny_model_dir: Path, tmp_path: Path) -> None:
    source = write_through_engine(tiny_model_dir, tmp_path)
    source.add_request(PROMPT, GREEDY, request_id="s0")
    for _ in range(4):
        source.step()
    assert source.offload is not None
    source.offload.tiers.flush()
    written = source.offload.tiers.tiers[0].stats.writes
    assert written >= 5  # the prompt's full blocks, each as it filled
    records, kv = snapshot(source)
    expected = []
    while source.has_unfinished():
        expected += [out.token_id for out in source.step()]

    restored = write_through_engine(tiny_model_dir, tmp_path)  # the same node's store
    assert restored.offload is not None
    restore_with_kv(restored, records, kv)
    assert restored.offload.already_held == written  # every block it registered, found in the store
    restored.offload.tiers.flush()
    assert restored.offload.tiers.tiers[0].stats.writes == 0
    tokens = []
    while restored.has_unfinished():
        tokens += [out.token_id for out in restored.step()]
    assert tokens == expected
