"""Dense weights (kernels/packed_linear): the same products as F.linear at decode's few rows (the CPU kernel:
float32 sums, rounded once) and prefill's many (oneDNN's blocked copy where bf16 packs: bit for bit, oneDNN computes
both; the CPU kernel at every row count where it does not); weights that cannot be packed pass through unchanged."""

import pytest
import torch
import torch.nn.functional as F

from fleetctl.kernels.packed_linear import PACKED_ROW_LIMIT, PackedWeight, can_pack, linear, pack

pytestmark = pytest.mark.skipif(not torch.backends.mkldnn.is_available(), reason="no oneDNN in this torch build")
# oneDNN packs bf16 only where the CPU has bf16 instructions (or AVX-512); an AVX2-only CPU leaves it plain
BF16_PACKS = torch.ops.mkldnn._is_mkldnn_bf16_supported()


@pytest.mark.parametrize("rows", [0, 1, 3, 16, 300])
def test_bf16_products_are_f_linears(rows: int) -> None:
    torch.manual_seed(rows)
    weight = torch.randn(96, 80, dtype=torch.bfloat16)
    x = torch.randn(rows, 80, dtype=torch.bfloat16)
    packed = pack(weight)
    assert isinstance(packed, PackedWeight) is BF16_PACKS
    assert packed.shape == weight.shape and packed.dtype == weight.dtype
    if rows == 0 or (BF16_PACKS and rows > PACKED_ROW_LIMIT):
        assert torch.equal(linear(x, packed), F.linear(x, weight))
    else:  # the CPU kernel: float32 sums in another order, one rounding to bf16
        torch.testing.assert_close(linear(x, packed), F.linear(x, weight), rtol=8e-3, atol=1e-2)


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
    torch.testing.assert_close(linear(x, pack(weight)), F.linear(x, weight), rtol=8e-3, atol=1e-2)
    packed = pack(weight)
    assert torch.equal(packed.plain if isinstance(packed, PackedWeight) else packed, weight)


def test_what_cannot_be_packed_stays_as_it_is() -> None:
    half = torch.randn(8, 8, dtype=torch.float16)
    assert not can_pack(half) and pack(half) is half
    x = torch.randn(2, 8, dtype=torch.float16)
    assert torch.equal(linear(x, half), F.linear(x, half))
