"""Session retention (`--session-ttl`): a named session's cached blocks stay in the pool after its turn while
other cached blocks can be reclaimed instead, so its next turn is a pool hit even when other traffic filled the
pool meanwhile; once the TTL has run out they go like any other (to the host tier, where the next turn finds
them). Unnamed requests keep nothing. The block manager's clock is a fake one: no test waits for a TTL."""

from pathlib import Path

import pytest

from fleetctl.engine.core.block_manager import BlockManager, CachedBlock
from fleetctl.engine.core.engine_settings import EngineConfig, EngineSettings
from fleetctl.engine.core.llm_engine import LLMEngine
from fleetctl.engine.core.sequence import SamplingParams

GREEDY = SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True)
PROMPT = [(7 * i) % 300 + 3 for i in range(90)]  # 5 full blocks of 16 and 10 tokens more
OTHERS = [[(11 * i + 13 * n) % 300 + 3 for i in range(90)] for n in range(1, 4)]
TTL_S = 60.0


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def engine_with_clock(model_dir: Path, tmp_path: Path) -> tuple[LLMEngine, FakeClock]:
    """16 blocks: room for a session's 5 and two other prompts' 6 each, so a third must reclaim 5 cached ones."""
    settings = EngineSettings(dtype="float32", deterministic=True, num_kv_blocks=16, session_ttl_s=TTL_S,
                              kv_offload_memory_bytes=16 << 20, kv_offload_host_dir=tmp_path / "host")
    engine = LLMEngine(EngineConfig(model_dir=model_dir, settings=settings))
    clock = FakeClock()
    engine.kv_cache.allocator.clock = clock
    return engine, clock


def turn(engine: LLMEngine, prompt: list[int], session: str = "") -> tuple[list[int], int, dict[str, int]]:
    """The answer's tokens, the prompt tokens its prefill took from the pool's cache, and what a tier served."""
    seq = engine.add_request(prompt, GREEDY, session=session)
    engine.step()
    assert engine.last_step is not None
    hit, tiers = engine.last_step.cached_tokens[0], engine.last_step.tier_tokens.get(seq.request_id, {})
    while engine.has_unfinished():
        engine.step()
    assert engine.offload is not None
    engine.offload.tiers.flush()
    return seq.output_token_ids, hit, tiers


@pytest.mark.parametrize("session", ["agent-1", ""])
def test_a_sessions_next_turn_is_a_pool_hit_within_the_ttl(tiny_model_dir: Path, tmp_path: Path,
                                                           session: str) -> None:
    engine, clock = engine_with_clock(tiny_model_dir, tmp_path)
    first, _, _ = turn(engine, PROMPT, session)
    for other in OTHERS:  # the third reclaims five cached blocks: the session's are kept, the first other's go
        turn(engine, other)
    clock.now += TTL_S / 2
    again, hit, tiers = turn(engine, PROMPT, session)
    assert again == first and hit == 80
    assert tiers == ({} if session else {"host": 80})  # kept in the pool, or read back from the tier


def test_after_the_ttl_a_sessions_blocks_go_like_any_others(tiny_model_dir: Path, tmp_path: Path) -> None:
    engine, clock = engine_with_clock(tiny_model_dir, tmp_path)
    first, _, _ = turn(engine, PROMPT, "agent-1")
    clock.now += TTL_S + 1
    for other in OTHERS:
        turn(engine, other)
    again, hit, tiers = turn(engine, PROMPT, "agent-1")
    assert again == first and hit == 80 and tiers == {"host": 80}


def cached_blocks(retained_for: float, clock: FakeClock) -> tuple[BlockManager, list[bytes]]:
    """A 3-block pool holding three cached blocks, least recently used first: "a" (a session's, released with
    `retained_for` seconds of retention), "b", "c"; and the list the reclaimed ones' names go to."""
    blocks, reclaimed = BlockManager(3, block_size=2, root=b"r" * 32, clock=clock), []
    blocks.on_reclaim = lambda _, cached: reclaimed.append(cached.block_hash)
    for name in (b"a", b"b", b"c"):
        block = blocks.register_loaded(CachedBlock(name, b"r" * 32, (1, 2)))
        assert block is not None
        if name == b"a":
            blocks.allocate(0, reuse=[block])  # a session's turn held it...
            blocks.free([block], retain_s=retained_for)  # ...and ended
    return blocks, reclaimed


def test_a_retained_block_is_reclaimed_last_and_only_when_nothing_else_can_be() -> None:
    clock = FakeClock()
    blocks, reclaimed = cached_blocks(TTL_S, clock)
    blocks.allocate(2)
    assert reclaimed == [b"b", b"c"]  # "a" is the least recently used, but retained
    blocks.allocate(1)
    assert reclaimed == [b"b", b"c", b"a"]  # nothing else left: a retained block is not a reserved one


def test_a_retention_that_ran_out_is_plain_lru_again() -> None:
    clock = FakeClock()
    blocks, reclaimed = cached_blocks(TTL_S, clock)
    clock.now += TTL_S
    blocks.allocate(1)
    assert reclaimed == [b"a"]
