"""Decode and prefill of each weight format (`--quantization`) against llama.cpp on the very GGUF the model was
pulled from, same threads, same run, and against the bandwidth ceiling: the bytes one decode step reads (layer
matrices as stored, the lm_head, the KV) over this machine's measured read bandwidth at those threads.

llama.cpp runs through llama-cpp-python's low-level API in another interpreter (`--llama-python`; build it with
CMAKE_ARGS="-DGGML_NATIVE=OFF -DGGML_AVX512=ON …" pip install llama-cpp-python), at the same batches
(`llama_cpp_decode.py`: that many sequences decoding together). Prints ratios, not absolute claims.

    python scripts/bench_quantized.py [--model smollm2-135m] [--quantization none,int8,int4] [--batches 1,16,64]
        [--llama-python /path/to/venv/bin/python] [--dtype bfloat16|float32]
"""

import argparse
import json
import subprocess
from pathlib import Path

import torch
from bench_decode import best_of, engine_decode_tokens_per_s

from fleetctl.console.cli.models import resolve_model
from fleetctl.engine.core.engine_settings import EngineConfig, EngineSettings
from fleetctl.engine.core.llm_engine import LLMEngine
from fleetctl.engine.core.sequence import SamplingParams
from fleetctl.engine.model.model_store import SOURCE_GGUF
from fleetctl.engine.model.weights import matrix_bytes

PREFILL_LENGTHS = (500, 2000)
LLAMA_CPP = Path(__file__).with_name("llama_cpp_decode.py")

def read_bandwidth(threads: int, megabytes: int = 1024) -> float:
    """Bytes/s this process reads from memory at `threads`: a float32 sum over a buffer far larger than caches."""
    torch.set_num_threads(threads)
    buffer = torch.ones(megabytes * 2**20 // 4)
    buffer.sum()
    return buffer.numel() * 4 / best_of(5, buffer.sum)


def step_bytes(engine: LLMEngine, batch: int, context: int) -> int:
    """Bytes a decode step reads: layer matrices as stored, the lm_head once, and each sequence's KV."""
    weights = engine.model.weights
    head = matrix_bytes(weights.lm_head)
    spec = engine.kv_cache.spec
    return weights.layer_matrix_bytes + head + batch * context * spec.bytes_per_block // spec.block_size


def prefill_tokens_per_s(engine: LLMEngine, length: int, repeats: int) -> float:
    ids = (engine.tokenizer.encode("The lighthouse keeper climbed the stairs. ") * length)[:length]
    params = SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True)
    engine.generate([ids], params)
    return length / best_of(repeats, lambda: engine.generate([ids], params))


def llama_cpp(python: str, gguf: Path, threads: int, new_tokens: int, batches: list[int]) -> dict[str, float]:
    run = subprocess.run([python, str(LLAMA_CPP), str(gguf), str(threads), str(new_tokens), json.dumps(batches),
                          json.dumps(PREFILL_LENGTHS)], capture_output=True, text=True, check=True)
    return json.loads(run.stdout.splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--quantization", default="none,int8,int4")
    parser.add_argument("--batches", default="1,16,64")
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--dtype", default="bfloat16", help="The dtype dense weights and activations compute in.")
    parser.add_argument("--llama-python", default="", help="An interpreter with llama_cpp (skipped when empty).")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    model_dir: Path = resolve_model(args.model)
    bandwidth = read_bandwidth(args.threads)
    print(f"model {model_dir.name}  threads {args.threads}  read bandwidth {bandwidth / 1e9:.1f} GB/s")

    batches = [int(b) for b in args.batches.split(",")]
    theirs: dict[str, float] = {}
    if args.llama_python:
        theirs = llama_cpp(args.llama_python, model_dir / SOURCE_GGUF, args.threads, args.new_tokens, batches)
        print("llama.cpp on the same GGUF: " + "  ".join(f"{k} {v:.1f} tok/s" for k, v in theirs.items()))

    print(f"{'weights':<10} {'batch':>5} {'tok/s':>8} {'vs llama':>9} {'ceiling':>8} {'of ceil':>8} {'MB/step':>8}")
    prefill: dict[str, dict[int, float]] = {}
    for name in args.quantization.split(","):
        settings = EngineSettings(dtype=args.dtype, quantization=name, num_kv_blocks=2048, max_num_seqs=max(batches),
                                  max_num_batched_tokens=max(PREFILL_LENGTHS), prefix_cache=False)
        engine = LLMEngine(EngineConfig(model_dir, settings=settings))
        label = engine.weights_label
        for batch in batches:
            ours = engine_decode_tokens_per_s(engine, batch, args.new_tokens, args.repeats)
            read = step_bytes(engine, batch, 20 + args.new_tokens)
            ceiling = batch * bandwidth / read
            vs = f"{ours / theirs[f'decode{batch}']:>8.2f}x" if theirs else f"{'-':>9}"
            print(f"{label:<10} {batch:>5} {ours:>8.1f} {vs} {ceiling:>8.1f} {ours / ceiling:>8.0%} "
                  f"{read / 1e6:>8.1f}")
        prefill[label] = {n: prefill_tokens_per_s(engine, n, args.repeats) for n in PREFILL_LENGTHS}
        del engine
    dense = next(iter(prefill.values()))
    for label, rates in prefill.items():
        cells = "  ".join(f"{n}: {rate:.0f} tok/s ({rate / dense[n]:.2f}x of {next(iter(prefill))}"
                          + (f", {rate / theirs[f'prefill{n}']:.2f}x llama.cpp)" if theirs else ")")
                          for n, rate in rates.items())
        print(f"prefill {label:<10} {cells}")


if __name__ == "__main__":
    main()
