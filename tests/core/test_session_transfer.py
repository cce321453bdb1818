"""A session moved between two engines while it decodes (core/session_transfer.py, in one process): the
source keeps stepping between the pre-copy stages; after the final stage the destination's tokens are the
ones an unmoved run makes (deterministic mode, greedy and seeded), and it is still its agent session's turn; a
move called off leaves the session
decoding on the source; every block comes back."""

from pathlib import Path

import pytest
import torch

from fleetctl.engine.core.engine_settings import EngineConfig, EngineSettings, KVDtype
from fleetctl.engine.core.llm_engine import LLMEngine
from fleetctl.engine.core.sequence import SamplingParams
from fleetctl.engine.core.session_transfer import SessionTransfer, TransferRefused

BLOCKS = 64
PROMPT = "The quick brown fox jumps over the lazy dog. " * 3
GREEDY = SamplingParams(max_tokens=60, temperature=0.0, ignore_eos=True)
SEEDED = SamplingParams(max_tokens=60, temperature=0.9, seed=5, ignore_eos=True)


def engine(model_dir: Path, kv_dtype: KVDtype = KVDtype.AUTO) -> LLMEngine:
    settings = EngineSettings(dtype="float32", deterministic=True, num_kv_blocks=BLOCKS, kv_dtype=kv_dtype)
    return LLMEngine(EngineConfig(model_dir, settings=settings))


def steps(engine: LLMEngine, count: int) -> None:
    for _ in range(count):
        engine.step()


def unmoved(model_dir: Path, params: SamplingParams, kv_dtype: KVDtype = KVDtype.AUTO) -> list[int]:
    return engine(model_dir, kv_dtype).generate([PROMPT], params)[0].token_ids


@pytest.mark.parametrize("kv_dtype", list(KVDtype))
@pytest.mark.parametrize("params", [GREEDY, SEEDED], ids=["greedy", "seeded"])
def test_a_session_moved_mid_decode_continues_token_identical(tiny_model_dir: Path, params: SamplingParams,
                                                              kv_dtype: KVDtype) -> None:
    source, dest = engine(tiny_model_dir, kv_dtype), engine(tiny_model_dir, kv_dtype)
    out, into = SessionTransfer(source), SessionTransfer(dest)
    seq = source.add_request(PROMPT, params, request_id="s", session="agent-7")
    steps(source, 5)
    reserved = into.reserve(8)
    copied = 0
    for _ in range(2):  # pre-copy stages, the session decoding on between them
        full = out.final_blocks(out.running("s"))
        blocks = out.read(seq, copied, full)  # [layers, 2, n, block_size, Hkv, d (an int8 pool's rows: d + 2)]
        assert blocks.dtype == source.kv_cache.spec.storage_dtype  # an int8 pool's rows move as they are
        into.write(reserved, copied, blocks)
        copied = full
        steps(source, 9)
    state, last = out.stop(seq)
    source.step()  # the stopped session takes no step
    assert len(seq.output_token_ids) == len(state.output_token_ids)
    reserved = into.grow(reserved, last)
    into.write(reserved, copied, out.read(seq, copied, last))
    moved = into.attach(state, reserved)
    assert moved.session == "agent-7"  # its retention (--session-ttl) goes with it
    source.release("s")
    assert source.kv_cache.allocator.num_free == BLOCKS
    while dest.has_unfinished():
        dest.step()
    assert moved.output_token_ids == unmoved(tiny_model_dir, params, kv_dtype)
    assert dest.kv_cache.allocator.num_free == BLOCKS


def test_a_move_called_off_leaves_the_session_on_the_source(tiny_model_dir: Path) -> None:
    source, dest = engine(tiny_model_dir), engine(tiny_model_dir)
    out, into = SessionTransfer(source), SessionTransfer(dest)
    seq = source.add_request(PROMPT, GREEDY, request_id="s")
    steps(source, 5)
    reserved = into.reserve(8)
    out.stop(seq)
    into.free(reserved)  # the destination refused: its reservation goes back
    out.restart("s")
    while source.has_unfinished():
        source.step()
    assert seq.output_token_ids == unmoved(tiny_model_dir, GREEDY)
    assert source.kv_cache.allocator.num_free == BLOCKS and dest.kv_cache.allocator.num_free == BLOCKS


def test_refusals(tiny_model_dir: Path) -> None:
    source = engine(tiny_model_dir)
    out = SessionTransfer(source)
    seq = source.add_request(PROMPT, GREEDY, request_id="s")
    with pytest.raises(TransferRefused):  # queued, not decoding
        out.running("s")
    with pytest.raises(TransferRefused):
        out.reserve(BLOCKS + 1)
    steps(source, 2)
    assert out.running("s") is seq
    assert out.read(seq, 0, 1).shape[2] == 1 and isinstance(out.read(seq, 0, 1), torch.Tensor)
