"""A live engine's sessions as plain records plus the KV blocks they use (for checkpoints), and the
two ways back: load the KV into fresh blocks, or cold start (re-prefill every session from tokens)."""

from dataclasses import asdict

import torch

from fleetctl.engine.llm_engine import LLMEngine
from fleetctl.engine.sequence import SamplingParams, Sequence, SequenceStatus


def snapshot(engine: LLMEngine) -> tuple[list[dict], torch.Tensor]:
    """Records of every unfinished sequence and kv [layers, 2, n_blocks, block_size, Hkv, d] on the CPU,
    holding only the blocks those sequences use; each record's block_table indexes into it."""
    records, used_blocks = snapshot_records(engine)
    index = torch.tensor(used_blocks, dtype=torch.int64, device=engine.device)
    return records, engine.kv_cache.tensor.index_select(2, index).cpu()


def snapshot_records(engine: LLMEngine) -> tuple[list[dict], list[int]]:
    """The records of `snapshot`, and the pool blocks (in order) that its kv tensor would gather."""
    scheduler = engine.scheduler
    block_size = engine.kv_cache.spec.block_size
    seqs = [*scheduler.running, *scheduler.parked.values(), *scheduler.waiting]
    records, used_blocks = [], []
    for seq in seqs:
        cached = seq.num_cached_tokens if seq.status is not SequenceStatus.WAITING else 0
        count = -(-cached // block_size)
        records.append({
            "request_id": seq.request_id,
            "prompt_token_ids": seq.prompt_token_ids,
            "output_token_ids": seq.output_token_ids,
            "params": {**asdict(seq.params), "stop": list(seq.params.stop)},
            "seed": seq.seed,
            "status": seq.status.value,
            "num_cached_tokens": cached,
            "block_table": list(range(len(used_blocks), len(used_blocks) + count)),
            "stop_criteria": {"eos_token_ids": sorted(engine.tokenizer.eos_token_ids),
                              "max_tokens": seq.params.max_tokens, "max_model_len": engine.max_model_len},
        })
        used_blocks += seq.block_table[:count]
    return records, used_blocks


def _params(record: dict) -> SamplingParams:
    raw = dict(record["params"])
    raw["stop"] = tuple(raw.get("stop", ()))
    return SamplingParams(**raw)


def restore_with_kv(engine: LLMEngine, records: list[dict], kv: torch.Tensor) -> int:
    """Load each session's KV into fresh blocks and resume it where it stopped. Returns KV bytes loaded."""
    loaded = 0
    for record in records:
        if not record["num_cached_tokens"]:
            cold_start(engine, [record])
            continue
        seq = Sequence(record["prompt_token_ids"], _params(record), request_id=record["request_id"],
                       output_token_ids=list(record["output_token_ids"]), seed=record["seed"])
        blocks = kv.index_select(2, torch.tensor(record["block_table"], dtype=torch.int64))
        engine.adopt(seq, blocks, parked=record["status"] == SequenceStatus.PARKED.value)
        loaded += blocks.numel() * blocks.element_size()
    return loaded


def cold_start(engine: LLMEngine, records: list[dict]) -> None:
    """Queue every session for recompute from its tokens (prompt + output so far)."""
    for record in records:
        engine.add_request(record["prompt_token_ids"], _params(record), request_id=record["request_id"],
                           output_token_ids=list(record["output_token_ids"]), seed=record["seed"])
