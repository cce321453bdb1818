"""The CPU's row-wise C kernels (kernels/cpu_rows) against their torch references: RMSNorm with and without the
residual add, in float32 and bf16, at decode's rows and prefill's; and `ops` routing CPU rows through them."""

import pytest
import torch

from fleetctl.kernels import cpu_rows, ops
from fleetctl.kernels.rms_norm import rms_norm_ref


def test_it_builds_here() -> None:
    assert cpu_rows._library() is not None


@pytest.mark.parametrize("residual", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("rows", [1, 3, 40])
def test_rms_norm_is_the_reference(rows: int, dtype: torch.dtype, residual: bool) -> None:
    generator = torch.Generator().manual_seed(rows)
    x = torch.randn(rows, 576, generator=generator).to(dtype)
    weight = torch.randn(576, generator=generator).to(dtype)
    stream = torch.randn(rows, 576, generator=generator).to(dtype) if residual else None
    out, new_stream = cpu_rows.rms_norm(x, weight, 1e-5, stream)
    expected, expected_stream = rms_norm_ref(x, weight, 1e-5, stream)
    assert out.dtype == dtype and out.shape == x.shape
    assert torch.equal(new_stream, expected_stream)  # the residual stream: x + residual, rounded as torch's add
    tolerance = dict(rtol=1e-5, atol=1e-5) if dtype == torch.float32 else dict(rtol=8e-3, atol=8e-3)
    torch.testing.assert_close(out.float(), expected.float(), **tolerance)


def test_ops_routes_cpu_rows_through_the_kernel_unless_a_dispatch_mode_watches() -> None:
    from torch.utils.flop_counter import FlopCounterMode  # imports triton: not before tests/kernels' interpreter

    x, weight = torch.randn(2, 64), torch.randn(64)
    assert cpu_rows.takes(x, weight, None)
    with FlopCounterMode(display=False):
        assert not cpu_rows.takes(x, weight, None)  # torch's own ops, which the counter sees
    torch.testing.assert_close(ops.rms_norm(x, weight, 1e-6)[0], rms_norm_ref(x, weight, 1e-6)[0])


def test_what_the_kernel_does_not_take_goes_to_torch() -> None:
    half = torch.randn(2, 64, dtype=torch.float16)
    assert not cpu_rows.takes(half, torch.randn(64, dtype=torch.float16), None)
    assert not cpu_rows.takes(torch.randn(2, 64), torch.randn(64, dtype=torch.bfloat16), None)  # mixed dtypes
