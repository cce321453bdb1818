"""Dense weight matrices laid out once, at load, for the CPU's products at every row count.

- A few rows (decode: up to `cpu_gemv.max_rows()`, and FLOAT32_ROW_LIMIT / PACKED_ROW_LIMIT below): this package's
  streaming kernel (`cpu_gemv`) over the plain row-major weight, at the memory's bandwidth.
- More rows (prefill, big decode batches): oneDNN's GEMM on its own blocked layout, packed once here where the CPU
  has bf16 instructions — `F.linear` on a plain bf16 weight reorders it into that layout on every call, which
  costs more than the product at tens of rows; in float32 `F.linear` runs MKL's GEMM on the plain weight, no
  slower than a packed one, so float32 weights stay plain.

The cost of a bf16 `PackedWeight`: the blocked copy is the worker's own memory, beside the plain weights (a
memory-map that workers on one machine share in the page cache).
"""

from dataclasses import dataclass, replace

import torch
import torch.nn.functional as F

from fleetctl.kernels import cpu_gemv


@dataclass(frozen=True)
class PackedWeight:
    """A dense [N, K] weight and oneDNN's blocked copy of it (opaque: shape and dtype, no indexing)."""

    plain: torch.Tensor
    blocked: torch.Tensor

    @property
    def shape(self) -> torch.Size:
        return self.plain.shape

    @property
    def dtype(self) -> torch.dtype:
        return self.plain.dtype

    @property
    def device(self) -> torch.device:
        return self.plain.device

    def numel(self) -> int:
        return self.plain.numel()

    def element_size(self) -> int:
        return self.plain.element_size()


DenseWeight = torch.Tensor | PackedWeight


def can_pack(weight: torch.Tensor) -> bool:
    """oneDNN packs bf16 only on a CPU with bf16 instructions (AVX-512 BF16, AVX-NE-CONVERT, or AVX-512's
    emulation of them): an AVX2-only CPU multiplies bf16 weights through `F.linear`, unpacked."""
    return (weight.device.type == "cpu" and weight.dtype == torch.bfloat16 and torch.backends.mkldnn.is_available()
            and torch.ops.mkldnn._is_mkldnn_bf16_supported())


def pack(weight: torch.Tensor) -> DenseWeight:
    """weight [N, K] -> a PackedWeight where oneDNN packs it, else the weight itself (contiguous on a CPU, as the
    streaming kernel reads it)."""
    if weight.device.type == "cpu":
        weight = weight.contiguous()
    if not can_pack(weight):
        return weight
    return PackedWeight(weight, torch.ops.mkldnn._reorder_linear_weight(weight, None))


# The most rows of x the streaming kernel takes a dense weight at (scripts/bench_gemv.py, 2 threads of a Zen 2):
# float32 at 8 (the kernel is 1.25-1.7x MKL's sgemm at 16 rows and 0.7x at 64, but its sums land up to 3x further
# from MKL's than MKL's own at another row count: a chunked prefill's logits moved 1.5e-4 where 1e-4 holds); a bf16
# weight oneDNN packed at 8 (its blocked GEMM on bf16 instructions); a plain bf16 weight (a CPU without bf16
# instructions, where F.linear is 4.5-5.5x slower at 16-64 rows, and a prefill's) at every row count.
FLOAT32_ROW_LIMIT, PACKED_ROW_LIMIT = 8, 8


def cpu_operands(weight: DenseWeight) -> cpu_gemv.Operands | None:
    """What the streaming kernel reads of the weight: its plain rows, where they are contiguous on a CPU."""
    plain = weight.plain if isinstance(weight, PackedWeight) else weight
    if not plain.is_cpu or not plain.is_contiguous():
        return None
    operands = cpu_gemv.Operands(cpu_gemv.dense_format(plain.dtype), plain, plain.shape[0])
    if plain.dtype == torch.float32:
        return replace(operands, row_limit=FLOAT32_ROW_LIMIT)
    return replace(operands, row_limit=PACKED_ROW_LIMIT) if isinstance(weight, PackedWeight) else operands.unlimited


def linear(x: torch.Tensor, weight: DenseWeight) -> torch.Tensor:
    """x [T, K] @ weight [N, K]ᵀ -> [T, N], weight plain or packed."""
    operands = cpu_operands(weight)
    if operands is not None and cpu_gemv.takes(x, operands):
        return cpu_gemv.gemv(x, operands)
    if isinstance(weight, PackedWeight):
        return torch.ops.mkldnn._linear_pointwise(x.contiguous(), weight.blocked, None, "none", [], "")
    return F.linear(x, weight)
