"""The CPU streaming kernel (kernels/cpu_gemv): every weight format against its float reference at each row count
it takes, with odd output counts (a partial chunk per thread) and one thread or two; the build cache."""

import pytest
import torch

from fleetctl.kernels import cpu_build, cpu_gemv, quantized_linear
from fleetctl.kernels.cpu_gemv import Operands, WeightFormat, gemv
from fleetctl.kernels.quantized_linear import (
    QuantizedWeight,
    int8_blocks,
    int8_split,
    q4_blocks,
    q4_codes,
    quantize_int4,
    quantize_int8,
)

ROWS = (1, 2, 5, 8, 13, 64)  # one pass of registers (up to 8), and several (past it, up to the most a call takes)


def _x(rows: int, cols: int, dtype: torch.dtype) -> torch.Tensor:
    return torch.randn(rows, cols, generator=torch.Generator().manual_seed(rows)).to(dtype)


def _row_scales(weight: QuantizedWeight) -> torch.Tensor:
    """The q4 scales and zeros as the kernel reads them: [N, K/group, 2]."""
    return weight.scales.transpose(0, 1).contiguous()


def test_it_builds_here() -> None:
    """CI's machines have a C compiler: the kernel is part of the product, not an option."""
    assert cpu_gemv.max_rows() == 64  # 0 where it could not be built


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("rows", ROWS)
def test_dense_products_are_the_float_product(rows: int, dtype: torch.dtype, threads: int) -> None:
    weight = torch.randn(101, 96, generator=torch.Generator().manual_seed(0)).to(dtype)
    x = _x(rows, 96, dtype)
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        out = gemv(x, Operands(cpu_gemv.dense_format(dtype), weight, 101))
    finally:
        torch.set_num_threads(previous)
    reference = x.float() @ weight.float().T
    assert out.shape == (rows, 101) and out.dtype == dtype
    if dtype == torch.float32:
        torch.testing.assert_close(out, reference, rtol=1e-5, atol=1e-5)
    else:  # float32 sums, one rounding to bf16 at the end
        torch.testing.assert_close(out.float(), reference, rtol=8e-3, atol=1e-2)


@pytest.mark.parametrize("rows", ROWS)
def test_int8_rows_in_float32_are_the_product_with_the_dequantized_weight(rows: int) -> None:
    weight = quantize_int8(torch.randn(75, 64, generator=torch.Generator().manual_seed(1)))
    x = _x(rows, 64, torch.float32)
    out = gemv(x, Operands(WeightFormat.I8, weight.data, 75, weight.scales))
    torch.testing.assert_close(out, x @ weight.dequantize().T, rtol=1e-5, atol=1e-4)


def _within_the_8_bit_rounding(x: torch.Tensor, dense: torch.Tensor, out: torch.Tensor) -> None:
    """bf16 inputs take the integer dot product (x rounded per block of 32, as llama.cpp's Q8): each input moves
    at most half its block's step (max |x| / 254), and the output rounds once to bf16."""
    reference = x.float() @ dense.T
    half_step = (x.float().abs().reshape(len(x), -1, 32).amax(dim=2) / 254).repeat_interleave(32, dim=1)
    bound = half_step @ dense.abs().T + reference.abs() * 2**-8 + 1e-4
    assert ((out.float() - reference).abs() <= bound).all()
    assert (out.float() - reference).abs().max() > 0  # the integer path ran: float products would be exact here


@pytest.mark.parametrize("rows", ROWS)
def test_int8_rows_in_bf16_round_x_to_8_bits_per_block(rows: int) -> None:
    weight = quantize_int8(torch.randn(75, 96, generator=torch.Generator().manual_seed(1)).bfloat16())
    weight.data[0, :32] = -128  # |-128| reads as 128 unsigned in the byte product
    x = _x(rows, 96, torch.bfloat16)
    out = gemv(x, Operands(WeightFormat.I8, weight.data, 75, weight.scales))
    _within_the_8_bit_rounding(x, weight.dequantize(), out)


def _int8_blocks(dtype: torch.dtype) -> QuantizedWeight:
    """A Q8_0-like weight [75, 96]: codes over the whole int8 range (-128 too), a scale per block of 32 that differs
    between blocks by up to 10x (a per-row scale would get them wrong)."""
    generator = torch.Generator().manual_seed(3)
    codes = torch.randint(-128, 128, (75, 96), generator=generator)
    scales = torch.rand(75, 3, generator=generator) * 0.09 + 0.01
    return int8_blocks(codes, scales, dtype)


@pytest.mark.parametrize("rows", [*ROWS, 70])
def test_int8_blocks_in_float32_are_the_product_with_the_dequantized_weight(rows: int) -> None:
    weight = _int8_blocks(torch.float32)
    x = _x(rows, 96, torch.float32)
    out = gemv(x, quantized_linear.cpu_operands(weight))
    torch.testing.assert_close(out, x @ weight.dequantize().T, rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("rows", [*ROWS, 70])
def test_int8_blocks_in_bf16_round_x_to_8_bits_per_block(rows: int) -> None:
    weight = _int8_blocks(torch.bfloat16)
    x = _x(rows, 96, torch.bfloat16)
    out = quantized_linear.linear(x, weight)  # past 64 rows too: torch has no kernel for it
    _within_the_8_bit_rounding(x, weight.dequantize(), out)


@pytest.mark.parametrize("rows", [1, 3])
def test_int8_rows_in_bf16_of_k_not_a_multiple_of_32_take_float_products(rows: int) -> None:
    weight = quantize_int8(torch.randn(75, 48, generator=torch.Generator().manual_seed(1)).bfloat16())
    x = _x(rows, 48, torch.bfloat16)
    out = gemv(x, Operands(WeightFormat.I8, weight.data, 75, weight.scales))
    torch.testing.assert_close(out.float(), x.float() @ weight.dequantize().T, rtol=8e-3, atol=2e-2)


@pytest.mark.parametrize("group", [32, 64, 128])
@pytest.mark.parametrize("rows", [1, 3, 8, 19])
def test_q4_rows_in_float32_are_exact_to_rounding(rows: int, group: int) -> None:
    weight = quantize_int4(torch.randn(48, 256, generator=torch.Generator().manual_seed(group)), group)
    x = _x(rows, 256, torch.float32)
    out = gemv(x, Operands(WeightFormat.Q4, weight.data, 48, _row_scales(weight), group))
    torch.testing.assert_close(out, x @ weight.dequantize().T, rtol=1e-5, atol=1e-4)


# eight blocks a pass, then the blocks left over (K % 256) two at a time and an odd one alone; the zeros' terms in
# the pass at G = 32 only
@pytest.mark.parametrize(("group", "inputs"), [(32, 96), (32, 256), (32, 576), (32, 608), (64, 576), (128, 640)])
@pytest.mark.parametrize("rows", [1, 5, 8, 40])
def test_q4_rows_in_bf16_round_x_to_8_bits_per_block(rows: int, group: int, inputs: int) -> None:
    generator = torch.Generator().manual_seed(group + inputs)
    weight = quantize_int4(torch.randn(48, inputs, generator=generator).bfloat16(), group)
    x = _x(rows, inputs, torch.bfloat16)
    out = gemv(x, Operands(WeightFormat.Q4, weight.data, 48, _row_scales(weight), group))
    _within_the_8_bit_rounding(x, weight.dequantize(), out)


def test_q4_blocks_round_trip_and_hold_input_j_beside_j_plus_16() -> None:
    codes = torch.randint(0, 16, (6, 64), generator=torch.Generator().manual_seed(3))
    blocks = q4_blocks(codes)
    assert blocks.shape == (6, 32) and blocks.dtype == torch.uint8
    assert int(blocks[2, 5]) == int(codes[2, 5]) | int(codes[2, 21]) << 4
    assert torch.equal(q4_codes(blocks), codes.to(torch.int32))


@pytest.mark.slow  # two builds of the library (~20 s): `make test` runs it, `make test-fast` does not
def test_the_build_is_cached_per_source_and_machine(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("FLEET_KERNEL_CACHE", str(tmp_path))
    built = cpu_build.build()
    assert built.name.startswith("cpu_kernels-") and built.parent == tmp_path and built.exists()
    modified = built.stat().st_mtime_ns
    assert cpu_build.build() == built and built.stat().st_mtime_ns == modified  # not compiled twice


def test_a_compiler_that_fails_is_one_clear_error(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("FLEET_KERNEL_CACHE", str(tmp_path))
    monkeypatch.setenv("CC", "false")
    with pytest.raises(cpu_build.KernelBuildError, match=r"compiling the CPU kernels failed"):
        cpu_build.build()
    assert not list(tmp_path.glob("*.so"))


@pytest.mark.parametrize("rows", [1, 5, 12])
def test_int8_split_rows_in_bf16_are_the_products_of_x_rounded_to_8_bits(rows: int) -> None:
    """Two int4 halves over [x, x] whose zeros' terms cancel large products (the high half's codes sit around 8):
    the sums of x those terms take must be of the x the dots take (rounded to int8), or the rounding errors' sum
    times 8 s stays (~10 % of a row before this was so)."""
    generator = torch.Generator().manual_seed(rows)
    codes = torch.randint(-40, 41, (48, 576), generator=generator)
    scales = torch.rand(48, 576 // 32, generator=generator) * 0.01 + 0.001
    weight = int8_split(codes, scales, torch.zeros_like(scales), torch.bfloat16)
    x = _x(rows, 576, torch.bfloat16)
    operands = Operands(WeightFormat.Q4, weight.data, 48, _row_scales(weight), 32, doubled_inputs=True)
    blocks = x.double().reshape(rows, -1, 32)  # x as the kernel rounds it: to int8 per block of 32
    step = blocks.abs().amax(dim=2, keepdim=True) / 127
    rounded = (blocks * (127 / blocks.abs().amax(dim=2, keepdim=True))).round() * step
    expected = rounded.reshape(rows, -1) @ weight.dequantize().double().T
    out = gemv(x, operands).double()
    assert ((out - expected).abs() <= expected.abs() * 2**-7 + expected.abs().amax() * 2**-9).all()
