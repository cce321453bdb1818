"""Weight-only int8/int4/int8-split linear layers: layouts that round-trip exactly, products within the kernel's
rounding of a float reference, round-to-nearest within half a step, one clear error for what a layout cannot take;
and the CUDA path where there is a GPU."""

import pytest
import torch
import torch.nn.functional as F

from fleetctl.kernels import ops
from fleetctl.kernels.quantized_linear import (
    QuantFormat,
    QuantizationError,
    QuantizedWeight,
    int4_from_codes,
    int8_split,
    linear,
    quantize_int4,
    quantize_int8,
    round_int8_groups,
    unpack_int4,
)

ROWS, COLS = 96, 256


def random_int4(dtype: torch.dtype, group: int, device: str = "cpu") -> tuple[torch.Tensor, ...]:
    generator = torch.Generator().manual_seed(group)
    codes = torch.randint(0, 16, (ROWS, COLS), dtype=torch.uint8, generator=generator)
    scales = torch.rand(ROWS, COLS // group, generator=generator).to(dtype) / 16
    zeros = torch.randn(ROWS, COLS // group, generator=generator).to(dtype) / 8
    return codes.to(device), scales.to(device), zeros.to(device)


@pytest.mark.parametrize("group", [32, 64, 128])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_int4_layout_round_trips_codes_scales_and_zeros_exactly(group: int, dtype: torch.dtype) -> None:
    codes, scales, zeros = random_int4(dtype, group)
    weight = int4_from_codes(codes, scales, zeros, group)
    assert torch.equal(unpack_int4(weight), codes.to(torch.int32))
    expected = (codes.float() - 8) * scales.float().repeat_interleave(group, 1) + zeros.float().repeat_interleave(
        group, 1)
    assert torch.equal(weight.dequantize(), expected)
    assert weight.nbytes == ROWS * COLS // 2 + 2 * ROWS * (COLS // group) * scales.element_size()


def test_int8_split_layout_is_exactly_code_times_scale_plus_offset() -> None:
    generator = torch.Generator().manual_seed(11)
    codes = torch.randint(-128, 128, (ROWS, COLS), generator=generator)
    scales = (torch.rand(ROWS, COLS // 32, generator=generator) / 16).half().float()  # a GGUF's fp16 d
    offsets = (torch.randn(ROWS, COLS // 32, generator=generator) / 8).half().float()
    weight = int8_split(codes, scales, offsets, torch.float32)
    assert weight.format is QuantFormat.INT8_SPLIT and (weight.in_features, weight.packed_features) == (COLS, 2 * COLS)
    high, low = unpack_int4(weight).split(COLS, dim=1)
    assert torch.equal(16 * (high - 8) + low, codes.to(torch.int32))
    expected = codes.float() * scales.repeat_interleave(32, 1) + offsets.repeat_interleave(32, 1)
    assert torch.equal(weight.dequantize(), expected)
    assert weight.nbytes == ROWS * COLS + 2 * 2 * ROWS * (COLS // 32) * 4  # a byte a weight; 2 scales, 2 zeros
    with pytest.raises(QuantizationError, match="do not fit codes"):
        int8_split(codes, scales[:, :4], offsets[:, :4], torch.float32)


def _quantized(dense: torch.Tensor, fmt: QuantFormat) -> QuantizedWeight:
    if fmt is QuantFormat.INT8:
        return quantize_int8(dense)
    if fmt is QuantFormat.INT8_SPLIT:
        return int8_split(*round_int8_groups(dense), dense.dtype)
    return quantize_int4(dense, 32)


@pytest.mark.parametrize("fmt", list(QuantFormat))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("tokens", [1, 5, 33])
def test_linear_is_the_float_product_with_its_own_dequantized_weight(fmt: QuantFormat, dtype: torch.dtype,
                                                                      tokens: int) -> None:
    dense = torch.randn(ROWS, COLS, generator=torch.Generator().manual_seed(tokens)).to(dtype)
    weight = _quantized(dense, fmt)
    x = torch.randn(tokens, COLS, generator=torch.Generator().manual_seed(7)).to(dtype)
    out = linear(x, weight)
    assert out.shape == (tokens, ROWS) and out.dtype == dtype
    reference = x.float() @ weight.dequantize().T
    if dtype is torch.float32:
        torch.testing.assert_close(out, reference, rtol=1e-5, atol=1e-4)
    else:  # the kernel rounds the dequantized weight and the output to bf16: as F.linear in bf16 does; the CPU's
        # 4-bit rows also round x to 8 bits per block of 32 (kernels/cpu_gemv): each input by half its block's step
        bf16 = F.linear(x, weight.dequantize().to(dtype)).float()
        half_step = (x.float().abs().reshape(tokens, -1, 32).amax(dim=2) / 254).repeat_interleave(32, dim=1)
        rounding_x = (half_step @ weight.dequantize().abs().T).max().item() if fmt is not QuantFormat.INT8 else 0.0
        tolerance = 2 * (bf16 - reference).abs().max().item() + rounding_x + 1e-2
        assert (out.float() - reference).abs().max().item() <= tolerance
    assert torch.equal(ops.linear(x, weight), out)


@pytest.mark.parametrize("group", [32, 128])
def test_round_to_nearest_int4_is_within_half_a_step(group: int) -> None:
    dense = torch.randn(ROWS, COLS, generator=torch.Generator().manual_seed(3))
    weight = quantize_int4(dense, group)
    step = weight.scales[..., 0].T.repeat_interleave(group, 1)  # [N, K]
    assert ((weight.dequantize() - dense).abs() <= step / 2 + 1e-6).all()


def test_round_to_nearest_int8_groups_is_within_half_a_step_per_group() -> None:
    dense = torch.randn(ROWS, COLS, generator=torch.Generator().manual_seed(4))
    codes, scales, offsets = round_int8_groups(dense)
    assert codes.abs().max() == 127 and not offsets.any()
    step = scales.repeat_interleave(32, 1)
    assert ((int8_split(codes, scales, offsets, torch.float32).dequantize() - dense).abs() <= step / 2 + 1e-6).all()


def test_round_to_nearest_int8_is_within_half_a_step_per_channel() -> None:
    dense = torch.randn(ROWS, COLS, generator=torch.Generator().manual_seed(4))
    weight = quantize_int8(dense)
    assert weight.data.dtype == torch.int8 and weight.scales.shape == (ROWS,)
    assert ((weight.dequantize() - dense).abs() <= weight.scales[:, None] / 2 + 1e-6).all()


def test_what_a_layout_cannot_take_is_one_clear_error() -> None:
    dense = torch.randn(ROWS, COLS)
    with pytest.raises(QuantizationError, match="group size must be one of 32, 64, 128"):
        quantize_int4(dense, 48)
    with pytest.raises(QuantizationError, match="divisible by the group size: 96 by 64"):
        quantize_int4(torch.randn(8, 96), 64)
    with pytest.raises(QuantizationError, match=r"computing in torch\.bfloat16 got torch\.float32"):
        linear(torch.randn(2, COLS), quantize_int8(dense.bfloat16()))
    codes, scales, zeros = random_int4(torch.float32, 32)
    with pytest.raises(QuantizationError, match="do not fit codes"):
        int4_from_codes(codes, scales[:, :4], zeros[:, :4], 32)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("fmt", list(QuantFormat))
def test_cuda_linear_matches_the_cpu_layout(fmt: QuantFormat) -> None:
    dense = torch.randn(ROWS, COLS, generator=torch.Generator().manual_seed(5)).bfloat16()
    x = torch.randn(9, COLS, generator=torch.Generator().manual_seed(6)).bfloat16()
    cpu, gpu = _quantized(dense, fmt), _quantized(dense.cuda(), fmt)
    if fmt is not QuantFormat.INT8:
        assert torch.equal(unpack_int4(gpu).cpu(), unpack_int4(cpu))
    reference = x.float() @ cpu.dequantize().T
    torch.testing.assert_close(linear(x.cuda(), gpu).float().cpu(), reference, rtol=2e-2, atol=5e-2)
