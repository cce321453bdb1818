"""An int8 KV row (kernels/kv_quant.py): d codes and a bf16 scale; each value within half a step of the stored
scale, the scale bf16(max |x| / 127), a row of zeros all zeros, -x the negated codes."""

import pytest
import torch

from fleetctl.kernels.kv_quant import SCALE_BYTES, dequantize_rows, quantize_rows, stored_width


def rows(count: int = 40, head_dim: int = 64, dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
    generator = torch.Generator().manual_seed(3)
    x = torch.randn(count, 3, head_dim, generator=generator) * torch.logspace(-3, 2, count)[:, None, None]
    x[:, :, 5] *= 20  # an outlier channel, as rotated keys have
    return x.to(dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_each_value_is_within_half_a_step_of_its_row_scale(dtype: torch.dtype) -> None:
    x = rows(dtype=dtype)
    stored = quantize_rows(x)
    assert stored.dtype == torch.int8 and stored.shape == (40, 3, stored_width(64)) == (40, 3, 64 + SCALE_BYTES)
    scale = stored[..., 64:].contiguous().view(torch.bfloat16).float()
    assert torch.equal(scale, (x.float().abs().amax(-1, keepdim=True) / 127).to(torch.bfloat16).float())
    assert stored[..., :64].abs().max() <= 127
    error = (dequantize_rows(stored, torch.float32) - x.float()).abs()
    assert (error <= scale * 0.5 + scale * 2**-8 * 127).all()  # a step's half, and the scale's own rounding
    assert dequantize_rows(stored, dtype).dtype == dtype


def test_zero_rows_and_negation() -> None:
    x = rows(4)
    x[1, 2] = 0
    stored = quantize_rows(x)
    assert not stored[1, 2].any()
    assert torch.equal(quantize_rows(-x)[..., :64], -stored[..., :64])
    assert torch.equal(dequantize_rows(stored, torch.float32)[1, 2], torch.zeros(64))
