"""Weight-only quantized linear layers: int8 per output channel (or, for a GGUF's head, in llama.cpp's Q8_0 blocks
of 32), int4 in groups along the input dimension, and 8-bit codes in groups of 32 held as two int4 halves
(int8-split).

On a CPU, decode's rows (up to 64) run in this package's streaming kernel (`cpu_gemv`), more rows in torch's
weight-only kernels (`cpu_operands`); on CUDA, torch's kernels at every row count:
- int8: `aten._weight_int8pack_mm(x, q [N, K] int8, scales [N])`, w = q · scale (CPU and CUDA); int8 in blocks
  (scales [N, K/32], group_size 32: a GGUF's Q8_0 head) runs in the streaming kernel at every row count on a CPU
  (torch has no grouped int8 kernel) and through its dequantized matrix elsewhere;
- int4: `aten._weight_int4pack_mm_for_cpu` on a CPU and `aten._weight_int4pack_mm` (tinygemm) on CUDA, with
  codes q in 0..15 and per group of `group_size` inputs a scale s and a zero z: w = (q − 8) · s + z. On a CPU
  the codes are kept in llama.cpp-style blocks of 32 inputs (`q4_blocks`: what the streaming kernel reads, and
  what the prepared-weights cache stores, the same on every CPU); torch's own layout, which depends on the
  CPU it was made on, is derived from them at load (`gemm_data`);
- int8-split: w = q · d + m per group of 32, q in −128..127 (llama.cpp's Q8_0, Q5_0, Q5_1 and 4-bit blocks all
  take this form). Torch has no grouped int8 kernel, so q = 16 · hi + lo (hi = q >> 4 in −8..7, lo = q & 15)
  is held as two int4 layouts over the same inputs — hi with scale 16d and zero 0, lo with scale d and zero
  8d + m — one int4 product over [x, x] and 2K inputs. Both halves are exact: w = 16d · hi + d · lo + m.

That int4 form holds llama.cpp's 4-bit blocks in groups of 32: Q4_1 (w = d · q + m per 32) is s = d, z = m + 8d,
Q4_0 (w = d · (q − 8)) is s = d, z = 0, and a Q4_K sub-block (w = d · sc · q − dmin · m) is s = d · sc,
z = 8 · d · sc − dmin · m (`engine/model/gguf_blocks.py`). Scales and zeros are kept in the dtype the
layer computes in (the kernels require it), so a float32 engine holds a GGUF's fp16 scales exactly and a
bfloat16 one rounds them to bfloat16.

A QuantizedWeight keeps its layout as plain tensors (codes packed two to a byte on a CPU, in tinygemm's
tiles on CUDA), so the prepared-weights cache stores it in safetensors and memory-maps it back. On CUDA, int4
computes in bfloat16 only (tinygemm).
"""

from dataclasses import dataclass, replace
from enum import StrEnum

import torch

from fleetctl.errors import UserError
from fleetctl.kernels import cpu_gemv

INT4_GROUP_SIZES = (32, 64, 128)  # as engine/core/engine_settings says (kernels import nothing of the engine)
SPLIT_GROUP = 32  # int8-split's group: a llama.cpp block
_CUDA_INNER_K_TILES = 8  # tinygemm's tiling of K; needs K divisible by 16 · 8


class QuantFormat(StrEnum):
    INT8 = "int8"
    INT4 = "int4"
    INT8_SPLIT = "int8-split"  # 8-bit codes per group of 32 as two int4 halves (the int4 kernel over [x, x])


class QuantizationError(UserError):
    """A weight that cannot take the asked layout (its shape, dtype or device)."""


@dataclass(frozen=True)
class QuantizedWeight:
    """A [out_features, in_features] weight in a weight-only layout; `linear` multiplies by it."""

    format: QuantFormat
    out_features: int
    in_features: int
    group_size: int  # inputs sharing one scale: in_features for int8 per channel, 32 for int8 in blocks
    data: torch.Tensor  # int8: [N, K] int8; int4 CPU: [N, K/2] uint8 q4 blocks; int4 CUDA: tinygemm's int32 tiles
    scales: torch.Tensor  # int8: [N] or [N, K/32]; int4: [K/group, N, 2] scale and zero, in the compute dtype
    # int8-split: data and scales as int4's over 2K inputs (the hi codes of every input, then the lo codes)
    gemm_data: torch.Tensor | None = None  # int4 on a CPU: the codes in torch's layout, for its kernel's many rows
    row_scales: torch.Tensor | None = None  # int4 on a CPU: scales [N, K/group, 2], each row's together (cpu_gemv)

    @property
    def dtype(self) -> torch.dtype:
        return self.scales.dtype

    @property
    def device(self) -> torch.device:
        return self.data.device

    @property
    def nbytes(self) -> int:
        """Bytes one decode product reads: the codes and their scales (and zeros)."""
        return self.data.numel() * self.data.element_size() + self.scales.numel() * self.scales.element_size()

    @property
    def blockwise(self) -> bool:
        """int8 with a scale per block of 32 inputs (a GGUF's Q8_0), not per output channel."""
        return self.format is QuantFormat.INT8 and self.group_size < self.in_features

    @property
    def packed_features(self) -> int:
        """Inputs the kernel multiplies over: 2K for int8-split (its two halves), K otherwise."""
        return 2 * self.in_features if self.format is QuantFormat.INT8_SPLIT else self.in_features

    def dequantize(self) -> torch.Tensor:
        """The float32 weight [N, K] this layout multiplies by (tests; the reference dequantization)."""
        if self.format is QuantFormat.INT8:
            blocks = self.data.float().reshape(self.out_features, -1, self.group_size)  # one block per scale
            return (blocks * self.scales.float().reshape(self.out_features, -1, 1)).reshape(self.data.shape)
        codes = unpack_int4(self).float()  # [N, packed_features]
        scale = self.scales[..., 0].float().T.repeat_interleave(self.group_size, dim=1)
        zero = self.scales[..., 1].float().T.repeat_interleave(self.group_size, dim=1)
        weight = (codes - 8) * scale + zero
        if self.format is QuantFormat.INT8_SPLIT:
            high, low = weight.split(self.in_features, dim=1)
            return high + low
        return weight


def quantize_int8(weight: torch.Tensor) -> QuantizedWeight:
    """Round-to-nearest, symmetric, one scale per output channel: weight [N, K] float."""
    absmax = weight.float().abs().amax(dim=1).clamp_min(torch.finfo(torch.float32).tiny)
    scales = absmax / 127
    codes = torch.round(weight.float() / scales[:, None]).clamp(-127, 127).to(torch.int8)
    return QuantizedWeight(QuantFormat.INT8, weight.shape[0], weight.shape[1], weight.shape[1], codes.contiguous(),
                           scales.to(weight.dtype))


def quantize_int4(weight: torch.Tensor, group_size: int) -> QuantizedWeight:
    """Round-to-nearest, asymmetric (min to max in 16 steps) per group of `group_size` inputs: weight [N, K]."""
    codes, scales, zeros = round_int4(weight, group_size)
    return int4_from_codes(codes, scales.to(weight.dtype), zeros.to(weight.dtype), group_size)


def round_int4(weight: torch.Tensor, group_size: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """`quantize_int4`'s rounding before any layout: codes [N, K] uint8, scales and zeros [N, K/group] float32."""
    rows, cols = weight.shape
    _check_int4_shape(cols, group_size)
    groups = weight.float().reshape(rows, cols // group_size, group_size)
    low, high = groups.amin(dim=2), groups.amax(dim=2)  # [N, K/group]
    scales = ((high - low) / 15).clamp_min(torch.finfo(torch.float32).tiny)
    codes = torch.round((groups - low[..., None]) / scales[..., None]).clamp(0, 15).reshape(rows, cols)
    return codes.to(torch.uint8), scales, low + 8 * scales


def round_int8_groups(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Round-to-nearest, symmetric, per group of 32 inputs (as llama.cpp's Q8_0): codes [N, K] int16 in
    −127..127, scales and offsets (zero) [N, K/32] float32, for `int8_split`."""
    rows, cols = weight.shape
    _check_int4_shape(cols, SPLIT_GROUP)
    groups = weight.float().reshape(rows, cols // SPLIT_GROUP, SPLIT_GROUP)
    scales = (groups.abs().amax(dim=2) / 127).clamp_min(torch.finfo(torch.float32).tiny)
    codes = torch.round(groups / scales[..., None]).clamp(-127, 127).reshape(rows, cols)
    return codes.to(torch.int16), scales, torch.zeros_like(scales)


def int8_blocks(codes: torch.Tensor, scales: torch.Tensor, dtype: torch.dtype) -> QuantizedWeight:
    """codes [N, K] integers in −128..127; scales [N, K/32]: w = code · scale per group of 32 inputs (llama.cpp's
    Q8_0), the scales kept in `dtype` (the dtype the layer computes in)."""
    rows, cols = codes.shape
    _check_int4_shape(cols, SPLIT_GROUP)
    if scales.shape != (rows, cols // SPLIT_GROUP):
        raise QuantizationError(f"int8 scales {tuple(scales.shape)} do not fit codes {tuple(codes.shape)} "
                                f"in groups of {SPLIT_GROUP}")
    return QuantizedWeight(QuantFormat.INT8, rows, cols, SPLIT_GROUP, codes.to(torch.int8).contiguous(),
                           scales.to(dtype).contiguous())


def int8_split(codes: torch.Tensor, scales: torch.Tensor, offsets: torch.Tensor, dtype: torch.dtype) -> QuantizedWeight:
    """codes [N, K] integers in −128..127; scales, offsets [N, K/32] float32: w = code · scale + offset per group
    of 32 inputs, as two int4 halves whose scales and zeros are computed in float32, then kept in `dtype` (the
    dtype the layer computes in)."""
    rows, cols = codes.shape
    if scales.shape != (rows, cols // SPLIT_GROUP) or offsets.shape != scales.shape:
        raise QuantizationError(f"int8 scales {tuple(scales.shape)} do not fit codes {tuple(codes.shape)} "
                                f"in groups of {SPLIT_GROUP}")
    codes, scales, offsets = codes.to(torch.int32), scales.float(), offsets.float()
    high, low = (codes >> 4) + 8, codes & 15  # codes = 16 · (high − 8) + low
    halves = int4_from_codes(torch.cat([high, low], dim=1).to(torch.uint8),
                             torch.cat([16 * scales, scales], dim=1).to(dtype),
                             torch.cat([torch.zeros_like(offsets), 8 * scales + offsets], dim=1).to(dtype), SPLIT_GROUP)
    return replace(halves, format=QuantFormat.INT8_SPLIT, in_features=cols)


def int4_from_codes(codes: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor, group_size: int) -> QuantizedWeight:
    """codes [N, K] in 0..15; scales, zeros [N, K/group] in the compute dtype: w = (code − 8) · scale + zero."""
    rows, cols = codes.shape
    _check_int4_shape(cols, group_size)
    if scales.shape != (rows, cols // group_size) or zeros.shape != scales.shape:
        raise QuantizationError(f"int4 scales {tuple(scales.shape)} do not fit codes {tuple(codes.shape)} "
                                f"in groups of {group_size}")
    scales_and_zeros = torch.stack([scales.T, zeros.T], dim=-1).contiguous()  # [K/group, N, 2]
    if codes.device.type == "cuda":
        pairs = (codes[:, ::2] << 4 | codes[:, 1::2]).to(torch.uint8)
        data = torch.ops.aten._convert_weight_to_int4pack(pairs.contiguous(), _CUDA_INNER_K_TILES)
        return QuantizedWeight(QuantFormat.INT4, rows, cols, group_size, data, scales_and_zeros)
    return with_gemm_layout(QuantizedWeight(QuantFormat.INT4, rows, cols, group_size, q4_blocks(codes),
                                            scales_and_zeros))


def q4_blocks(codes: torch.Tensor) -> torch.Tensor:
    """codes [N, K] in 0..15 -> [N, K/2] uint8: per block of 32 inputs, byte j holds input j (low nibble) and
    input j + 16 (high)."""
    rows, cols = codes.shape
    halves = codes.to(torch.uint8).reshape(rows, cols // 32, 2, 16)
    return (halves[:, :, 0] | halves[:, :, 1] << 4).reshape(rows, cols // 2)


def q4_codes(blocks: torch.Tensor) -> torch.Tensor:
    """`q4_blocks` undone: [N, K/2] uint8 -> codes [N, K] int32."""
    rows = blocks.shape[0]
    pairs = blocks.reshape(rows, -1, 1, 16)
    return torch.cat([pairs & 15, pairs >> 4], dim=2).reshape(rows, -1).to(torch.int32)


def with_gemm_layout(weight: QuantizedWeight) -> QuantizedWeight:
    """A CPU int4 or int8-split weight with torch's layout of its codes beside its q4 blocks, and its scales row by
    row for the C kernel (built at load)."""
    if weight.format is QuantFormat.INT8 or weight.device.type != "cpu":
        return weight
    gemm = torch.ops.aten._convert_weight_to_int4pack_for_cpu(q4_codes(weight.data).contiguous(), 1)
    return replace(weight, gemm_data=gemm, row_scales=weight.scales.transpose(0, 1).contiguous())


def unpack_int4(weight: QuantizedWeight) -> torch.Tensor:
    """The codes [N, packed_features] (int32, 0..15) of an int4 or int8-split weight: from the q4 blocks on a
    CPU, by multiplying the identity through tinygemm on CUDA."""
    if weight.device.type == "cpu":
        return q4_codes(weight.data)
    dtype = torch.bfloat16
    eye = torch.eye(weight.packed_features, dtype=dtype, device=weight.device)
    unit = torch.stack([torch.ones_like(weight.scales[..., 0]), torch.full_like(weight.scales[..., 0], 8)], dim=-1)
    ones = replace(weight, format=QuantFormat.INT4, in_features=weight.packed_features, scales=unit.to(dtype))
    return linear(eye, ones).T.round().to(torch.int32)  # (q − 8) · 1 + 8 = q: small integers, exact


def cpu_operands(weight: QuantizedWeight) -> cpu_gemv.Operands | None:
    """What the streaming kernel reads of a CPU weight, to 64 rows (int4: 1.1-1.8x torch's kernel; int8: about its
    time; scripts/bench_gemv.py). Not a prefill's: in bf16 the kernel rounds x to 8 bits per block of 32, and over a
    2,048-token prefill that doubles int4 smollm2's logit error against float32 (1.2x faster at 500 tokens, though).
    None where another kernel computes it."""
    if weight.device.type != "cpu":
        return None
    if weight.format is QuantFormat.INT8:
        if weight.blockwise:  # torch has no kernel for it: the streaming one at every row count
            return cpu_gemv.Operands(cpu_gemv.WeightFormat.I8, weight.data, weight.out_features, weight.scales,
                                     SPLIT_GROUP).unlimited
        return cpu_gemv.Operands(cpu_gemv.WeightFormat.I8, weight.data, weight.out_features, weight.scales)
    if weight.row_scales is None:
        return None
    return cpu_gemv.Operands(cpu_gemv.WeightFormat.Q4, weight.data, weight.out_features, weight.row_scales,
                             weight.group_size, doubled_inputs=weight.format is QuantFormat.INT8_SPLIT)


def linear(x: torch.Tensor, weight: QuantizedWeight) -> torch.Tensor:
    """x [T, K] @ weightᵀ -> [T, N], in x's dtype (which must be the weight's compute dtype)."""
    if x.dtype != weight.dtype:
        raise QuantizationError(f"a {weight.format} weight computing in {weight.dtype} got {x.dtype} inputs")
    x = x.contiguous()
    operands = cpu_operands(weight)
    if operands is not None and cpu_gemv.takes(x, operands):
        return cpu_gemv.gemv(x, operands)
    if weight.blockwise:
        return x @ weight.dequantize().to(x.dtype).T
    if weight.format is QuantFormat.INT8:
        return torch.ops.aten._weight_int8pack_mm(x, weight.data, weight.scales)
    if weight.format is QuantFormat.INT8_SPLIT:
        x = torch.cat([x, x], dim=-1)  # [T, 2K]: the high halves' inputs, then the low halves'
    if weight.device.type == "cuda":
        return torch.ops.aten._weight_int4pack_mm(x, weight.data, weight.group_size, weight.scales)
    if weight.gemm_data is None or weight.row_scales is None:
        raise QuantizationError("a CPU int4 weight without torch's layout: build it with_gemm_layout at load")
    return torch.ops.aten._weight_int4pack_mm_for_cpu(x, weight.gemm_data, weight.group_size, weight.scales)


def _check_int4_shape(in_features: int, group_size: int) -> None:
    if group_size not in INT4_GROUP_SIZES:
        raise QuantizationError(f"int4 group size must be one of {', '.join(map(str, INT4_GROUP_SIZES))}, "
                                f"got {group_size}")
    if in_features % group_size:
        raise QuantizationError(f"int4 needs in_features divisible by the group size: {in_features} by {group_size}")
