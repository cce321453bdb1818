"""Prefill throughput of the engine vs one Hugging Face transformers forward over the same token ids,
same model, dtype and run: tokens/s at each prompt length, and the ratio. Also the per-token cost
growth (tokens/s at the longest length over the shortest), and what chunked prefill costs: the same
prompt computed --chunk tokens per step (as `serve --max-num-batched-tokens` does) against one step.

    python scripts/bench_prefill.py [--model smollm2-135m] [--dtype bfloat16] [--lengths 128,500,2000,8000]
                                    [--chunk 2048]
"""

import argparse
import time

import torch

from fleetctl.console.cli.models import resolve_model
from fleetctl.engine.core.engine_settings import EngineConfig, EngineSettings
from fleetctl.engine.core.llm_engine import LLMEngine
from fleetctl.engine.core.sequence import SamplingParams

TEXT = "The lighthouse keeper counted the ships that passed in the night, one by one, and wrote them down. "


def best(repeats: int, fn) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--lengths", default="128,500,2000,8000")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--chunk", type=int, default=2048, help="step budget of the chunked engine")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    import transformers

    model_dir = resolve_model(args.model)
    def engine_with(budget: int) -> LLMEngine:
        settings = EngineSettings(dtype=args.dtype, num_kv_blocks=1100, prefix_cache=False,
                                  max_num_batched_tokens=budget)
        return LLMEngine(EngineConfig(model_dir, settings=settings))

    engine, chunked = engine_with(8192), engine_with(args.chunk)
    dtype = getattr(torch, args.dtype)
    hf = transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype).eval()
    ids = engine.tokenizer.encode(TEXT * 1000)
    print(f"{args.model} {args.dtype} threads={args.threads}")
    chunk_column = f"chunks of {args.chunk}"
    print(f"{'tokens':>7} {'engine tok/s':>13} {'HF tok/s':>9} {'ratio':>6} {chunk_column:>15} {'ratio':>6}")
    rates = {}
    for length in (int(n) for n in args.lengths.split(",")):
        if length >= engine.max_model_len:
            print(f"{length:>7} skipped: longer than the context ({engine.max_model_len})")
            continue
        prompt = ids[:length]

        def ours(prompt: list[int] = prompt, engine: LLMEngine = engine) -> None:
            seq = engine.add_request(prompt, SamplingParams(max_tokens=1, temperature=0.0))
            while not seq.output_token_ids:  # one step, or one per chunk
                engine.step()
            engine.release(seq.request_id)

        def theirs(prompt: list[int] = prompt) -> None:
            with torch.inference_mode():
                hf(torch.tensor([prompt]), use_cache=False, logits_to_keep=1)

        ours()
        ours(engine=chunked)
        theirs()
        mine, hfs = length / best(args.repeats, ours), length / best(args.repeats, theirs)
        in_chunks = length / best(args.repeats, lambda: ours(engine=chunked))
        rates[length] = mine
        print(f"{length:>7} {mine:>13.0f} {hfs:>9.0f} {mine / hfs:>6.2f} {in_chunks:>15.0f} {in_chunks / mine:>6.2f}")
    shortest, longest = min(rates), max(rates)
    print(f"per-token cost growth {shortest} → {longest} tokens: {rates[shortest] / rates[longest]:.2f}x")


if __name__ == "__main__":
    main()
