"""Each weight format's matrix product at decode's row counts, as the engine runs it (`ops.linear`: the C kernel
up to 8 rows, torch's GEMMs past them) and as torch alone would (`F.linear` or oneDNN's packed weight, torch's
int8 and int4 weight-only kernels), in GB/s of the weight's bytes against the memory's read bandwidth at the same
threads, same run. Every matrix of the model's layers, out of cache (each layer its own weights), plus the lm_head.

    python scripts/bench_gemv.py [--model smollm2-135m] [--rows 1,4,8,16,64] [--threads 2]
        [--formats float32,bfloat16,int8,int4]
"""

import argparse
from collections.abc import Callable

import torch
import torch.nn.functional as F
from bench_decode import best_of
from bench_quantized import read_bandwidth

from fleetctl.console.cli.models import resolve_model
from fleetctl.domain import Quantization
from fleetctl.engine.model.model_config import ModelConfig
from fleetctl.engine.model.prepared import load_cpu_weights
from fleetctl.engine.model.weights import Matrix, matrix_bytes
from fleetctl.kernels import ops
from fleetctl.kernels.packed_linear import PackedWeight
from fleetctl.kernels.quantized_linear import QuantFormat, QuantizedWeight

NAMES = ("qkv", "o_proj", "gate_up", "down")
_DENSE: dict[int, torch.Tensor] = {}  # blockwise int8 heads' dense copies, by id


def torch_product(x: torch.Tensor, weight: Matrix) -> torch.Tensor:
    """What torch alone runs for this weight: oneDNN on the packed copy, F.linear, or its weight-only kernels (a Q8_0
    head, which torch has no kernel for: F.linear on its dequantized copy)."""
    if isinstance(weight, PackedWeight):
        return torch.ops.mkldnn._linear_pointwise(x, weight.blocked, None, "none", [], "")
    if not isinstance(weight, QuantizedWeight):
        return F.linear(x, weight)
    if weight.blockwise:  # a GGUF's Q8_0 head: torch has no grouped int8 kernel, so it multiplies the dense head
        if id(weight) not in _DENSE:
            _DENSE[id(weight)] = weight.dequantize().to(x.dtype)
        return F.linear(x, _DENSE[id(weight)])
    if weight.format is QuantFormat.INT8:
        return torch.ops.aten._weight_int8pack_mm(x, weight.data, weight.scales)
    if weight.format is QuantFormat.INT8_SPLIT:
        x = torch.cat([x, x], dim=-1)
    return torch.ops.aten._weight_int4pack_mm_for_cpu(x, weight.gemm_data, weight.group_size, weight.scales)


def rate(matrices: list[Matrix], rows: int, dtype: torch.dtype, product: Callable) -> float:
    """Bytes/s of one pass of `rows` rows through every matrix (the best of 5)."""
    inputs = [torch.randn(rows, m.in_features if isinstance(m, QuantizedWeight) else m.shape[1]).to(dtype)
              for m in matrices]

    def one_pass() -> None:
        for x, matrix in zip(inputs, matrices, strict=True):
            product(x, matrix)

    one_pass()
    return sum(matrix_bytes(m) for m in matrices) / best_of(5, one_pass)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--rows", default="1,4,8,16,64")
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--formats", default="float32,bfloat16,int8,int4")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    model_dir = resolve_model(args.model)
    config = ModelConfig.from_file(model_dir / "config.json")
    bandwidth = read_bandwidth(args.threads)
    print(f"model {model_dir.name}  threads {args.threads}  read bandwidth {bandwidth / 1e9:.1f} GB/s")
    print(f"{'weights':<22} {'rows':>4} {'engine GB/s':>12} {'of bw':>6} {'torch GB/s':>11} {'engine/torch':>13}")
    rows = [int(r) for r in args.rows.split(",")]
    cases = [("float32", torch.float32, Quantization.NONE), ("bfloat16", torch.bfloat16, Quantization.NONE),
             ("int8", torch.bfloat16, Quantization.INT8), ("int4", torch.bfloat16, Quantization.INT4)]
    for label, dtype, quantization in (case for case in cases if case[0] in args.formats.split(",")):
        weights = load_cpu_weights(model_dir, config, dtype, quantization).packed()
        groups = {name: [getattr(layer, name) for layer in weights.layers] for name in NAMES}
        groups["lm_head"] = [weights.lm_head]
        for name, matrices in groups.items():
            for count in rows:
                ours = rate(matrices, count, dtype, ops.linear)
                theirs = rate(matrices, count, dtype, torch_product)
                print(f"{label + ' ' + name:<22} {count:>4} {ours / 1e9:>12.1f} {ours / bandwidth:>6.0%} "
                      f"{theirs / 1e9:>11.1f} {ours / theirs:>12.2f}x")


if __name__ == "__main__":
    main()
