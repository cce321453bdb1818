"""KV in 8 bits against KV in the model's dtype (`--kv-dtype int8` vs `auto`), same model, weights and run:

- tokens of KV per GiB, and the largest batch a pool of the same memory holds at each context (the memory: what
  the 16-bit pool needs for --batch sequences at the longest context);
- bytes per token on the wires: what a handoff or a live move ships (the session's blocks as the pool gives them
  up) and what a checkpoint writes (its files over its sessions' tokens);
- decode tokens/s at each context and --batch: the sequences share one long prompt through the prefix cache, so it
  is prefilled once, yet each reads its whole context from memory every step (the KV is most of what a step reads).

    python scripts/bench_kv_dtype.py [--model smollm2-135m] [--contexts 4096,8192] [--batch 16] [--threads 2]
        [--quantization int4] [--new-tokens 32]
"""

import argparse
import tempfile
import time
from pathlib import Path

import torch

from fleetctl.console.cli.models import resolve_model
from fleetctl.domain import WorkerRole
from fleetctl.engine.checkpoint.engine_io import current_compat, write_engine_checkpoint
from fleetctl.engine.core.block_allocator import BLOCK_SIZE, blocks_for
from fleetctl.engine.core.engine_settings import EngineConfig, EngineSettings, KVDtype
from fleetctl.engine.core.llm_engine import LLMEngine
from fleetctl.engine.core.sequence import SamplingParams, Sequence

CHUNK = 2048  # prompt tokens a prefill step takes


def engine(model_dir: Path, kv_dtype: KVDtype, blocks: int, args: argparse.Namespace) -> LLMEngine:
    settings = EngineSettings(dtype=args.dtype, quantization=args.quantization, kv_dtype=kv_dtype,
                              num_kv_blocks=blocks, max_num_seqs=args.batch, max_num_batched_tokens=CHUNK)
    return LLMEngine(EngineConfig(model_dir, settings=settings))


def prompts(context: int, batch: int) -> list[list[int]]:
    """`batch` prompts of `context` tokens sharing all but their last block's worth."""
    shared = [(7 * i) % 4000 + 10 for i in range(context - BLOCK_SIZE)]
    return [shared + [(13 * j + i) % 4000 + 10 for i in range(BLOCK_SIZE)] for j in range(batch)]


def started(llm: LLMEngine, ids: list[list[int]], params: SamplingParams) -> list[Sequence]:
    """The prompts admitted and prefilled: the first alone (so the others find its blocks in the prefix cache)."""
    seqs = [llm.add_request(ids[0], params)]
    while not seqs[0].output_token_ids:
        llm.step()
    seqs += [llm.add_request(p, params) for p in ids[1:]]
    while not all(s.output_token_ids for s in seqs):
        llm.step()
    return seqs


def decode_rate(llm: LLMEngine, context: int, batch: int, new_tokens: int) -> float:
    """Tokens/s of `batch` sequences decoding `new_tokens` each, ending at `context` tokens."""
    params = SamplingParams(max_tokens=new_tokens + 8, temperature=0.0, ignore_eos=True)
    seqs = started(llm, prompts(context - new_tokens - 8, batch), params)
    before = sum(len(s.output_token_ids) for s in seqs)
    start = time.perf_counter()
    for _ in range(new_tokens):
        llm.step()
    rate = (sum(len(s.output_token_ids) for s in seqs) - before) / (time.perf_counter() - start)
    for seq in seqs:
        llm.release(seq.request_id)
    return rate


def wire_bytes_per_token(llm: LLMEngine, tokens: int) -> tuple[float, float]:
    """(a handoff's or live move's bytes, a checkpoint's bytes) per token of one `tokens`-token session."""
    [seq] = started(llm, prompts(tokens, 1), SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True))
    shipped = llm.kv_cache.read_blocks(seq.block_table).nbytes / seq.num_tokens
    with tempfile.TemporaryDirectory() as root:
        _, _, written = write_engine_checkpoint(llm, "decode-0", WorkerRole.DECODE, current_compat(llm, "cpu"),
                                                Path(root), "bench", on_writer=lambda pid: None)
    llm.release(seq.request_id)
    return shipped, written / seq.num_tokens


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--quantization", default="none")
    parser.add_argument("--contexts", default="4096,8192")
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    model_dir = resolve_model(args.model)
    contexts = [int(c) for c in args.contexts.split(",")]
    longest = max(contexts)
    # the shared prompt once, each sequence's own last block and what it decodes, and the wire session's
    blocks = blocks_for(longest, BLOCK_SIZE) + args.batch * blocks_for(BLOCK_SIZE + args.new_tokens + 8, BLOCK_SIZE) \
        + blocks_for(2048 + 8, BLOCK_SIZE) + 16
    print(f"model {model_dir.name}  dtype {args.dtype}  weights {args.quantization}  threads {args.threads}  "
          f"batch {args.batch}")
    results: dict[KVDtype, dict[str, float]] = {}
    memory = 0
    for kv_dtype in KVDtype:
        llm = engine(model_dir, kv_dtype, blocks, args)
        spec = llm.kv_cache.spec
        if kv_dtype is KVDtype.AUTO:  # the memory the 16-bit pool needs for the batch at the longest context
            memory = args.batch * blocks_for(longest + args.new_tokens, BLOCK_SIZE) * spec.bytes_per_block
        row = {"label": spec.label, "tokens/GiB": 2**30 // spec.bytes_per_block * BLOCK_SIZE}
        for context in contexts:
            row[f"batch@{context}"] = memory // spec.bytes_per_block // blocks_for(context + args.new_tokens,
                                                                                    BLOCK_SIZE)
        row["wire B/token"], row["checkpoint B/token"] = wire_bytes_per_token(llm, 2048)
        for context in contexts:
            row[f"tok/s@{context}"] = decode_rate(llm, context, args.batch, args.new_tokens)
        results[kv_dtype] = row
        del llm
    wide, narrow = results[KVDtype.AUTO], results[KVDtype.INT8]
    print(f"{'':<20} {wide['label']:>12} {narrow['label']:>12} {'int8 / 16-bit':>14}")
    for key in (k for k in wide if k != "label"):
        print(f"{key:<20} {wide[key]:>12,.1f} {narrow[key]:>12,.1f} {narrow[key] / wide[key]:>13.2f}x")


if __name__ == "__main__":
    main()
