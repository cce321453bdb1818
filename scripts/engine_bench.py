"""scripts/gpu_bench.py's end-to-end part: decode tokens/s through LLMEngine at batch 1/8/32/128, on random weights
in smollm2-135m's shape (written to a temporary folder by tests/support/tiny_model.py, as no weights reach the
device), with the Triton kernels and with the torch references (FLEET_KERNELS=torch), and their ratio. `--tiny`:
the tiny model at batch 1/2, on CPU, the kernels through Triton's interpreter.

FLEET_KERNELS is read once per process, so each backend runs in a child: `engine_bench.py MODEL DEVICE DTYPE
BATCHES STEPS` (FLEET_KERNELS set) prints that backend's rates as one JSON line."""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

CHECKOUT = Path(__file__).resolve().parents[1]
WARMUP_STEPS = 2  # untimed decode steps of each batch before the timed ones
MAX_MODEL_LEN = 256  # bounds the kernel variants the engine's warm-up compiles
PROMPT = "The quick brown fox jumps over the lazy dog, number"


@dataclass(frozen=True)
class Setup:
    model: str  # what the table calls the model
    device: str
    dtype: str
    batches: tuple[int, ...]
    steps: int  # timed decode steps per batch
    kernels: str  # the FLEET_KERNELS of the kernels' run (the other runs FLEET_KERNELS=torch)


FULL = Setup("smollm2-135m's shape, random weights", "cuda:0", "bfloat16", (1, 8, 32, 128), 32, "auto")
TINY = Setup("the tiny model", "cpu", "float32", (1, 2), 3, "interpret")


def decode_rates(model_dir: Path, device: str, dtype: str, batches: list[int], steps: int) -> dict[str, object]:
    """This process's backend: each batch's decode tokens/s (its median step's) over `steps` steps, after its
    prefill and warm-up steps."""
    from fleetctl.engine.core.block_allocator import BLOCK_SIZE
    from fleetctl.engine.core.engine_settings import EngineConfig, EngineSettings
    from fleetctl.engine.core.llm_engine import LLMEngine
    from fleetctl.engine.core.sequence import SamplingParams
    from fleetctl.kernels import ops

    blocks_per_seq = -(-MAX_MODEL_LEN // BLOCK_SIZE)
    settings = EngineSettings(dtype=dtype, max_num_seqs=max(batches), max_model_len=MAX_MODEL_LEN,
                              num_kv_blocks=max(batches) * blocks_per_seq + 1)
    engine = LLMEngine(EngineConfig(model_dir, device=device, settings=settings))
    warm_up_s = engine.warm_up()
    params = SamplingParams(max_tokens=1 + WARMUP_STEPS + steps, temperature=0.0, ignore_eos=True)
    rates = {}
    for batch in batches:
        seqs = [engine.add_request(f"{PROMPT} {i}", params, request_id=f"{batch}-{i}") for i in range(batch)]
        while any(len(s.output_token_ids) < 1 + WARMUP_STEPS for s in seqs):  # prefill, then the warm-up steps
            engine.step()
        seconds = []  # per step, each a token for every sequence (reading its outputs syncs the device)
        while engine.has_unfinished():
            start = time.perf_counter()
            assert len(engine.step()) == batch
            seconds.append(time.perf_counter() - start)
        rates[batch] = batch / statistics.median(seconds)  # the median: a stray stall does not move it
    return {"backend": ops.backend(engine.device), "load_s": engine.load_seconds, "warm_up_s": warm_up_s,
            "rates": rates}


def run_backend(setup: Setup, model_dir: Path, kernels: str) -> dict[str, object]:
    env = {k: v for k, v in os.environ.items() if k not in ("FLEET_KERNELS", "TRITON_INTERPRET")}
    command = [sys.executable, __file__, str(model_dir), setup.device, setup.dtype,
               ",".join(map(str, setup.batches)), str(setup.steps)]
    result = subprocess.run(command, env={**env, "FLEET_KERNELS": kernels}, capture_output=True, text=True,
                            timeout=120)  # each well under a minute on a GPU
    if result.returncode:
        raise SystemExit(f"engine benchmark (FLEET_KERNELS={kernels}) exited {result.returncode}:\n"
                         f"{result.stderr[-3000:]}")
    return json.loads(result.stdout.splitlines()[-1])


def report(tiny: bool) -> None:
    """Both backends' decode tokens/s on the setup's model, as a table."""
    setup = TINY if tiny else FULL
    sys.path.insert(0, str(CHECKOUT / "tests"))
    from support import tiny_model

    with tempfile.TemporaryDirectory(prefix="engine-bench-") as folder:
        model_dir = tiny_model.write_tiny_llama(Path(folder), **({} if tiny else tiny_model.SMOLLM2_135M))
        kernels, torch_path = (run_backend(setup, model_dir, mode) for mode in (setup.kernels, "torch"))
    print(f"decode through LLMEngine, {setup.model}, {setup.dtype} on {setup.device}, {setup.steps} steps a batch "
          f"(after {WARMUP_STEPS} untimed)")
    for name, run in (("kernels", kernels), ("torch", torch_path)):
        print(f"  {name}: {run['backend']}, load {run['load_s']:.1f} s, warm-up {run['warm_up_s']:.1f} s")
    print(f"{'batch':>6} {'kernels tok/s':>14} {'torch tok/s':>12} {'ratio':>6}")
    for batch in setup.batches:
        ours, ref = kernels["rates"][str(batch)], torch_path["rates"][str(batch)]
        print(f"{batch:>6} {ours:>14.0f} {ref:>12.0f} {ours / ref:>6.2f}")


if __name__ == "__main__":
    model, device, dtype, batches, steps = sys.argv[1:]
    rates = decode_rates(Path(model), device, dtype, [int(b) for b in batches.split(",")], int(steps))
    print(json.dumps(rates))
