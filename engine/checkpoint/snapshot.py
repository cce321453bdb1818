"""A live engine's sessions as checkpoint records plus the KV blocks they use, and the two ways
back: load the KV into fresh blocks, or cold start (re-prefill every session from its tokens)."""

import torch

from fleetctl.engine.checkpoint.format import SAFETENSORS_DTYPES, KVPayload, SessionRecord, StopCriteria
from fleetctl.engine.core.block_allocator import blocks_for
from fleetctl.engine.core.llm_engine import LLMEngine
from fleetctl.engine.core.sequence import Sequence, SequenceStatus


def snapshot(engine: LLMEngine) -> tuple[list[SessionRecord], torch.Tensor]:
    """Records of every unfinished session and kv [layers, 2, n_blocks, block_size, Hkv, d] on the CPU,
    holding only the blocks those sessions use, each once (sessions sharing a cached prefix share its
    blocks); each record's block_table indexes into it."""
    records, used_blocks = snapshot_records(engine)
    return records, engine.kv_cache.read_blocks(used_blocks).cpu()


def snapshot_records(engine: LLMEngine) -> tuple[list[SessionRecord], list[int]]:
    """The records of `snapshot`, and the pool blocks (in order) that its kv tensor would gather."""
    scheduler = engine.scheduler
    block_size = engine.kv_cache.spec.block_size
    seqs = [*scheduler.running, *scheduler.parked.values(), *scheduler.prefilling, *scheduler.waiting]
    records = []
    index: dict[int, int] = {}  # pool block -> its place in the kv tensor, in first-use order
    for seq in seqs:
        # a prompt part-way through its chunks is saved as waiting: recomputed whole after a restore
        waiting = seq.status is SequenceStatus.WAITING or seq in scheduler.prefilling
        cached = 0 if waiting else seq.num_cached_tokens
        count = blocks_for(cached, block_size)
        first = 0 if waiting else seq.num_dropped_blocks
        records.append(SessionRecord(
            request_id=seq.request_id,
            prompt_token_ids=seq.prompt_token_ids,
            output_token_ids=seq.output_token_ids,
            params=seq.params,
            seed=seq.seed,
            status=SequenceStatus.WAITING if waiting else seq.status,
            num_cached_tokens=cached,
            block_table=[index.setdefault(block, len(index)) for block in seq.block_table[first:count]],
            first_block=first,
            session=seq.session,
            stop_criteria=StopCriteria(eos_token_ids=sorted(engine.tokenizer.eos_token_ids),
                                       max_tokens=seq.params.max_tokens, max_model_len=engine.max_model_len),
        ))
    return records, list(index)


def payload_of(kv: torch.Tensor) -> KVPayload:
    """kv: [layers, 2, n_blocks, block_size, Hkv, d] on the CPU, as raw bytes for the writer."""
    kv = kv.contiguous()
    memory = memoryview(kv.view(torch.uint8).reshape(-1).numpy()).cast("B")
    return KVPayload(_tag(kv), tuple(kv.shape), memory, ((0, memory.nbytes),))


def payload_of_blocks(pool: torch.Tensor, blocks: list[int]) -> KVPayload:
    """pool: the whole CPU pool [layers, 2, blocks, block_size, Hkv, d]; the payload is its `blocks`.
    Gathering this way costs the paused worker no copy: a forked writer reads its own copy-on-write
    view of the pool."""
    layers, _, num_blocks, *block_shape = pool.shape
    memory = memoryview(pool.view(torch.uint8).reshape(-1).numpy()).cast("B")
    block_bytes = memory.nbytes // (layers * 2 * num_blocks)
    runs = tuple((((layer * 2 + half) * num_blocks + block) * block_bytes, block_bytes)
                 for layer in range(layers) for half in range(2) for block in blocks)
    return KVPayload(_tag(pool), (layers, 2, len(blocks), *block_shape), memory, runs)


def _tag(tensor: torch.Tensor) -> str:
    return SAFETENSORS_DTYPES[str(tensor.dtype).removeprefix("torch.")]


def _sequence(record: SessionRecord) -> Sequence:
    return Sequence(list(record.prompt_token_ids), record.params, request_id=record.request_id,
                    output_token_ids=list(record.output_token_ids), seed=record.seed, session=record.session)


def restore_with_kv(engine: LLMEngine, records: list[SessionRecord], kv: torch.Tensor) -> int:
    """Load each session's KV into fresh blocks and resume it where it stopped. Returns KV bytes loaded."""
    loaded = 0
    for record in records:
        if not record.num_cached_tokens:
            cold_start(engine, [record])
            continue
        blocks = kv.index_select(2, torch.tensor(record.block_table, dtype=torch.int64))
        engine.adopt(_sequence(record), blocks, parked=record.status is SequenceStatus.PARKED,
                     first_block=record.first_block)
        loaded += blocks.numel() * blocks.element_size()
    return loaded


def cold_start(engine: LLMEngine, records: list[SessionRecord]) -> None:
    """Queue every session for recompute from its tokens (prompt + output so far)."""
    for record in records:
        engine.add_request(record.prompt_token_ids, record.params, request_id=record.request_id,
                           output_token_ids=list(record.output_token_ids), seed=record.seed, session=record.session)
