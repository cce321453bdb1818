"""Weight matrices packed once, at load, into the CPU GEMM library's own blocked layout (oneDNN).

`F.linear` on a CPU tensor hands oneDNN a plain row-major weight, which it reorders into its blocked
layout on every call: for decode's few rows that reorder costs more than the product itself. Measured on
this project's 2-core AVX-512 machine (smollm2's matrices, weights out of cache): a packed weight runs
1.6-2.4x faster than `F.linear` in bf16 and 1.2-3x in fp32 at 1-16 rows, and is no slower at 2,048. bf16
results are bit-identical to `F.linear`'s (oneDNN computes both); fp32 ones differ in the last bits
(`F.linear` uses another GEMM for fp32).

The cost: a packed copy is the worker's own memory, where the plain weights are a memory-map that
workers on one machine share in the page cache.
"""

import torch
import torch.nn.functional as F

PACKABLE = (torch.bfloat16, torch.float32)


def can_pack(weight: torch.Tensor) -> bool:
    """oneDNN packs bf16 only on a CPU with bf16 instructions (AVX-512 BF16, AVX-NE-CONVERT, or AVX-512's
    emulation of them): an AVX2-only CPU multiplies bf16 weights through `F.linear`, unpacked."""
    if weight.device.type != "cpu" or weight.dtype not in PACKABLE or not torch.backends.mkldnn.is_available():
        return False
    return weight.dtype != torch.bfloat16 or torch.ops.mkldnn._is_mkldnn_bf16_supported()


def pack(weight: torch.Tensor) -> torch.Tensor:
    """weight [N, K] -> an opaque oneDNN tensor that `linear` multiplies by (the weight itself where it
    cannot be packed: on a GPU, or in another dtype). The packed tensor keeps shape and dtype, not indexing."""
    if not can_pack(weight):
        return weight
    return torch.ops.mkldnn._reorder_linear_weight(weight.contiguous(), None)


def linear(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """x [T, K] @ weight [N, K]ᵀ -> [T, N], weight plain or packed."""
    if weight.is_mkldnn:
        return torch.ops.mkldnn._linear_pointwise(x.contiguous(), weight, None, "none", [], "")
    return F.linear(x, weight)
