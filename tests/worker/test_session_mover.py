"""A worker's side of a live move (worker/session_mover.py) between two engines in one process, through the real
shared-memory transport: a pre-copy stage bounded by `max_bytes` publishes whole blocks up to it and says more are
left, the stages in pieces carry every block, and the moved session decodes the tokens of an unmoved run."""

from pathlib import Path

from fleetctl.engine.core.engine_settings import EngineConfig, EngineSettings
from fleetctl.engine.core.llm_engine import LLMEngine
from fleetctl.engine.core.sequence import SamplingParams
from fleetctl.engine.worker import move_messages as mv
from fleetctl.engine.worker.kv_transport import KVTransport
from fleetctl.engine.worker.session_mover import SessionMover

BLOCKS = 64
PROMPT = "The quick brown fox jumps over the lazy dog. " * 8  # several full blocks of 16 tokens
GREEDY = SamplingParams(max_tokens=40, temperature=0.0, ignore_eos=True)


def engine(model_dir: Path) -> LLMEngine:
    settings = EngineSettings(dtype="float32", deterministic=True, num_kv_blocks=BLOCKS)
    return LLMEngine(EngineConfig(model_dir, settings=settings))


class Side:
    """An engine and its mover; `ask` hands it a message and returns its one answer."""

    def __init__(self, model_dir: Path, transport: KVTransport) -> None:
        self.engine = engine(model_dir)
        self.answers: list[object] = []
        self.mover = SessionMover(self.engine, transport, self.answers.append, lambda: None)

    def ask(self, msg: object) -> object:
        self.mover.handle(msg)
        answer = self.answers.pop()
        assert not isinstance(answer, mv.MoveRefused), answer
        return answer


def test_a_pre_copy_in_pieces_of_max_bytes_carries_every_block(tiny_model_dir: Path) -> None:
    transport = KVTransport()
    source, dest = Side(tiny_model_dir, transport), Side(tiny_model_dir, transport)
    seq = source.engine.add_request(PROMPT, GREEDY, request_id="s")
    for _ in range(3):
        source.engine.step()
    full = seq.num_cached_tokens // source.engine.kv_cache.spec.block_size
    assert full >= 3
    one_block = source.engine.kv_cache.spec.bytes_per_block
    dest.ask(mv.ReserveBlocks("mv", full + 4))
    first, pieces = 0, []
    while True:  # one block a piece: the source steps between them, the session decoding on
        sent = source.ask(mv.SendBlocks("mv", "s", first, max_bytes=one_block + one_block // 2))
        assert isinstance(sent, mv.BlocksSent)
        pieces.append((sent.num_blocks, sent.more))
        dest.ask(mv.ReceiveBlocks("mv", sent.handle, sent.first_block))
        first = sent.first_block + sent.num_blocks
        source.engine.step()
        if not sent.more:
            break
    assert pieces[:-1] == [(1, True)] * (len(pieces) - 1) and len(pieces) >= full
    final = source.ask(mv.SendBlocks("mv", "s", first, final=True))
    assert isinstance(final, mv.BlocksSent) and final.session is not None
    taken = dest.ask(mv.ReceiveBlocks("mv", final.handle, final.first_block, final.session))
    assert isinstance(taken, mv.BlocksReceived) and taken.committed
    for side in (source, dest):
        side.mover.handle(mv.EndMove("mv", True))
    tokens = list(final.session.output_token_ids)  # what the source made; the destination goes on from there
    while dest.engine.has_unfinished():
        tokens += [out.token_id for out in dest.engine.step() if out.request_id == "s"]
    assert tokens == engine(tiny_model_dir).generate([PROMPT], GREEDY)[0].token_ids
    assert source.engine.kv_cache.allocator.num_free == BLOCKS and dest.engine.kv_cache.allocator.num_free == BLOCKS
