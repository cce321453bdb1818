"""What `--deterministic` costs: decode tokens/s at batch 1 and 16 and prefill tokens/s of one
500-token prompt, batch-invariant numerics on vs off, same model, same dtype, same run.

    python scripts/bench_deterministic.py [--model smollm2-135m] [--dtype auto] [--threads 2]
"""

import argparse
import time

import torch

from fleetctl.console.cli.models import resolve_model
from fleetctl.engine.core.engine_settings import EngineConfig, EngineSettings
from fleetctl.engine.core.llm_engine import LLMEngine
from fleetctl.engine.core.sequence import SamplingParams

PROMPT = "Write a short story about a lighthouse keeper who finds a message in a bottle."


def decode_rate(engine: LLMEngine, batch: int, tokens: int = 32) -> float:
    params = SamplingParams(max_tokens=tokens, temperature=0.0, ignore_eos=True)
    seqs = [engine.add_request(PROMPT, params) for _ in range(batch)]
    engine.step()  # prefill
    start, done = time.perf_counter(), 0
    while engine.has_unfinished():
        done += len(engine.step())
    for seq in seqs:
        engine.release(seq.request_id)
    return done / (time.perf_counter() - start)


def prefill_rate(engine: LLMEngine, length: int = 500) -> float:
    ids = (engine.tokenizer.encode(PROMPT * 40))[:length]
    seq = engine.add_request(ids, SamplingParams(max_tokens=1, temperature=0.0))
    start = time.perf_counter()
    engine.step()
    engine.release(seq.request_id)
    return length / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    model_dir = resolve_model(args.model)
    rates: dict[bool, dict[str, float]] = {}
    for deterministic in (False, True):
        # no prefix cache: the repeated prompts would be served from it, not computed
        settings = EngineSettings(dtype=args.dtype, deterministic=deterministic, num_kv_blocks=1024,
                                  prefix_cache=False)
        engine = LLMEngine(EngineConfig(model_dir, settings=settings))
        decode_rate(engine, 1, 4)  # warm-up
        rates[deterministic] = {"decode b1": max(decode_rate(engine, 1) for _ in range(3)),
                                "decode b16": max(decode_rate(engine, 16) for _ in range(2)),
                                "prefill 500": max(prefill_rate(engine) for _ in range(3))}
    print(f"{args.model} {engine.dtype} threads={args.threads}")
    print(f"{'':<12} {'off tok/s':>10} {'on tok/s':>10} {'on/off':>7}")
    for name in rates[False]:
        off, on = rates[False][name], rates[True][name]
        print(f"{name:<12} {off:>10.1f} {on:>10.1f} {on / off:>7.2f}")


if __name__ == "__main__":
    main()
