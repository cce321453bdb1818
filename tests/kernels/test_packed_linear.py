"""Packed weights (kernels/packed_linear): the same products as F.linear — bit for bit in bf16 (oneDNN
computes both), to fp32 rounding in fp32 — at decode's few rows and prefill's many, and weights that
cannot be packed pass through unchanged."""

import pytest
import torch
import torch.nn.functional as F

from fleetctl.kernels.packed_linear import can_pack, linear, pack

pytestmark = pytest.mark.skipif(not torch.backends.mkldnn.is_available(), reason="no oneDNN in this torch build")
# oneDNN packs bf16 only where the CPU has bf16 instructions (or AVX-512); an AVX2-only CPU leaves it plain
BF16_PACKS = torch.ops.mkldnn._is_mkldnn_bf16_supported()


@pytest.mark.parametrize("rows", [0, 1, 3, 16, 300])
def test_bf16_products_are_f_linears_bit_for_bit(rows: int) -> None:
    torch.manual_seed(rows)
    weight = torch.randn(96, 80, dtype=torch.bfloat16)
    x = torch.randn(rows, 80, dtype=torch.bfloat16)
    packed = pack(weight)
    assert packed.is_mkldnn is BF16_PACKS and packed.shape == weight.shape and packed.dtype == weight.dtype
    assert torch.equal(linear(x, packed), F.linear(x, weight))


@pytest.mark.parametrize("rows", [1, 16, 300])
def test_fp32_products_agree_to_rounding(rows: int) -> None:
    torch.manual_seed(rows)
    weight, x = torch.randn(96, 80), torch.randn(rows, 80)
    torch.testing.assert_close(linear(x, pack(weight)), F.linear(x, weight), rtol=1e-5, atol=1e-5)


def test_a_row_does_not_depend_on_the_rows_beside_it() -> None:
    weight, x = pack(torch.randn(64, 48, dtype=torch.bfloat16)), torch.randn(8, 48, dtype=torch.bfloat16)
    assert torch.equal(linear(x, weight)[2:3], linear(x[2:3], weight))


def test_a_non_contiguous_input_and_the_matrix_back() -> None:
    weight = torch.randn(32, 40, dtype=torch.bfloat16)
    x = torch.randn(40, 6, dtype=torch.bfloat16).t()  # [6, 40], not contiguous
    assert torch.equal(linear(x, pack(weight)), F.linear(x, weight))
    assert torch.equal(pack(weight).to_dense(), weight)


def test_what_cannot_be_packed_stays_as_it_is() -> None:
    half = torch.randn(8, 8, dtype=torch.float16)
    assert not can_pack(half) and pack(half) is half
    x = torch.randn(2, 8, dtype=torch.float16)
    assert torch.equal(linear(x, half), F.linear(x, half))
