"""Decode throughput of the engine, eager and compiled (`--compile`), vs Hugging Face transformers
`generate` and vs the machine's ceiling (one pass of every weight matrix through the engine's packed
linear, the fastest product this machine runs; also through a plain F.linear), same model, dtype, batch
and run. Also model load time vs transformers' from_pretrained, and the compiled step's
warm-up, cold (an empty inductor cache) and warm (a new process, the cache kept). Prints ratios, not
absolute claims.

    python scripts/bench_decode.py [--model smollm2-135m] [--dtypes bfloat16,float32] [--batches 1,16]
"""

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from fleetctl.console.cli.models import resolve_model
from fleetctl.engine.core.engine_settings import CompileMode, EngineConfig, EngineSettings
from fleetctl.engine.core.llm_engine import LLMEngine
from fleetctl.engine.core.sequence import SamplingParams
from fleetctl.engine.model.model_config import ModelConfig
from fleetctl.engine.model.prepared import load_cpu_weights
from fleetctl.engine.model.weights import ModelWeights
from fleetctl.kernels.packed_linear import linear

PROMPT = "Write a short story about a lighthouse keeper who finds a message in a bottle."


def best_of(repeats: int, fn) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def ceiling_tokens_per_s(weights: ModelWeights, batch: int, repeats: int) -> float:
    """Tokens/s if a step did nothing but multiply `batch` rows by every weight matrix once (packed or not)."""
    matrices = [w for layer in weights.layers for w in (layer.qkv, layer.o_proj, layer.gate_up, layer.down)]
    matrices.append(weights.lm_head)
    inputs = {m.shape[1]: torch.randn(batch, m.shape[1], dtype=m.dtype) for m in matrices}

    def one_pass() -> None:
        for m in matrices:
            linear(inputs[m.shape[1]], m)

    one_pass()
    return batch / best_of(repeats, one_pass)


def engine_decode_tokens_per_s(engine: LLMEngine, batch: int, new_tokens: int, repeats: int) -> float:
    def run(n: int) -> float:
        params = SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True)
        return best_of(repeats, lambda: engine.generate([PROMPT] * batch, params))

    run(2)
    return batch * (new_tokens - 1) / (run(new_tokens) - run(1))


WARM_UP = """
import sys, time
from pathlib import Path
from fleetctl.engine.core.engine_settings import EngineConfig, EngineSettings
from fleetctl.engine.core.llm_engine import LLMEngine
settings = EngineSettings(dtype=sys.argv[2], compile="on", max_num_seqs=int(sys.argv[3]), num_kv_blocks=64)
print(LLMEngine(EngineConfig(Path(sys.argv[1]), settings=settings)).warm_up())
"""


def warm_up_seconds(model_dir: Path, dtype: str, max_num_seqs: int) -> tuple[float, float]:
    """(cold, warm) seconds to compile every bucket up to `max_num_seqs`, each in a new process: first with
    an empty inductor cache, then with the one the first left."""
    with tempfile.TemporaryDirectory(prefix="fleetctl-inductor-") as cache:
        env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": cache}
        runs = [subprocess.run([sys.executable, "-c", WARM_UP, str(model_dir), dtype, str(max_num_seqs)], env=env,
                               capture_output=True, text=True, check=True) for _ in range(2)]
    cold, warm = (float(run.stdout.split()[-1]) for run in runs)
    return cold, warm


def hf_decode_tokens_per_s(hf, ids: list[int], batch: int, new_tokens: int, repeats: int) -> float:
    inputs = torch.tensor([ids] * batch)

    def run(n: int) -> float:
        def gen() -> None:
            with torch.inference_mode():
                hf.generate(inputs, attention_mask=torch.ones_like(inputs), max_new_tokens=n, min_new_tokens=n,
                            do_sample=False, pad_token_id=0)
        return best_of(repeats, gen)

    run(2)
    return batch * (new_tokens - 1) / (run(new_tokens) - run(1))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--dtypes", default="bfloat16,float32")
    parser.add_argument("--batches", default="1,16")
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    import transformers

    model_dir: Path = resolve_model(args.model)
    print(f"model {model_dir}  torch threads {torch.get_num_threads()}  transformers {transformers.__version__}")

    for dtype_name in args.dtypes.split(","):
        dtype = getattr(torch, dtype_name)
        config = ModelConfig.from_file(model_dir / "config.json")
        load_cpu_weights(model_dir, config, dtype)  # builds the prepared-weights cache once
        weights = best_of(3, lambda: load_cpu_weights(model_dir, config, dtype))  # noqa: B023
        settings = EngineSettings(dtype=dtype_name, num_kv_blocks=64)
        ready = statistics.median(LLMEngine(EngineConfig(model_dir, settings=settings)).load_seconds for _ in range(3))
        hf_model = best_of(3, lambda: transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype))  # noqa: B023
        hf_tok = best_of(3, lambda: transformers.AutoTokenizer.from_pretrained(model_dir))
        print(f"load {dtype_name}: weights {weights:.3f} s vs from_pretrained {hf_model:.3f} s "
              f"({hf_model / weights:.1f}x); ready to generate (weights + tokenizer + KV pool) {ready:.3f} s "
              f"vs from_pretrained + AutoTokenizer {hf_model + hf_tok:.3f} s ({(hf_model + hf_tok) / ready:.1f}x)")

    batches = [int(b) for b in args.batches.split(",")]
    for dtype_name in args.dtypes.split(","):
        cold, warm = warm_up_seconds(model_dir, dtype_name, max(batches))
        print(f"compile {dtype_name}, buckets up to {max(batches)}: warm-up {cold:.1f} s cold, {warm:.1f} s warm")

    header = ("dtype", "batch", "eager tok/s", "compiled", "hf tok/s", "ceiling", "F.linear ceil", "compiled/eager",
              "eager vs hf", "compiled vs hf", "eager of ceil", "compiled of ceil")
    print(f"{header[0]:<9} " + " ".join(f"{h:>12}" for h in header[1:]))
    for dtype_name in args.dtypes.split(","):
        dtype = getattr(torch, dtype_name)
        engines = {mode: LLMEngine(EngineConfig(model_dir, settings=EngineSettings(
            dtype=dtype_name, num_kv_blocks=2048, compile=mode, max_num_seqs=max(batches))))
            for mode in (CompileMode.OFF, CompileMode.ON)}
        engines[CompileMode.ON].warm_up()
        hf = transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype).eval()
        ids = engines[CompileMode.OFF].tokenizer.encode(PROMPT)
        for batch in batches:
            eager = engine_decode_tokens_per_s(engines[CompileMode.OFF], batch, args.new_tokens, args.repeats)
            compiled = engine_decode_tokens_per_s(engines[CompileMode.ON], batch, args.new_tokens, args.repeats)
            theirs = hf_decode_tokens_per_s(hf, ids, batch, args.new_tokens, args.repeats)
            ceiling = ceiling_tokens_per_s(engines[CompileMode.OFF].model.weights, batch, args.repeats * 3)
            # a compiling engine keeps its weights plain: its pass is F.linear's
            plain = ceiling_tokens_per_s(engines[CompileMode.ON].model.weights, batch, args.repeats * 3)
            print(f"{dtype_name:<9} {batch:>12} {eager:>12.1f} {compiled:>12.1f} {theirs:>12.1f} {ceiling:>12.1f} "
                  f"{plain:>12.1f} "
                  f"{compiled / eager:>11.2f}x {eager / theirs:>11.2f}x {compiled / theirs:>11.2f}x "
                  f"{eager / ceiling:>12.0%} {compiled / ceiling:>12.0%}")


if __name__ == "__main__":
    main()
