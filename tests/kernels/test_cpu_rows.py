"""The CPU's small-op C kernels (kernels/cpu_rows) against their torch references, in float32 and bf16: RMSNorm with
and without the residual add, at decode's rows and prefill's; decode attention over a shuffled paged pool (GQA,
windows); the KV store; and `ops` routing CPU tensors through them."""

import pytest
import torch

from fleetctl.kernels import cpu_rows, ops
from fleetctl.kernels.glu import glu_ref
from fleetctl.kernels.paged_attention import paged_decode_attention_ref
from fleetctl.kernels.rms_norm import rms_norm_ref
from fleetctl.kernels.rotary import rotary_ref
from fleetctl.kernels.store_kv import store_kv_ref


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


def _pool(dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A [2, 20, 16, 2, 64] pool, three sequences' shuffled block tables [3, 5] and their context lengths."""
    generator = torch.Generator().manual_seed(5)
    kv = torch.randn(2, 20, 16, 2, 64, generator=generator).to(dtype)
    tables = torch.randperm(20, generator=generator)[:15].reshape(3, 5).to(torch.int32)
    return kv, tables, torch.tensor([5, 33, 70], dtype=torch.int32)


@pytest.mark.parametrize("window", [None, 7, 40])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("heads", [6, 40])  # 3 or 20 query heads on each of 2 KV heads (more than 16: two tasks)
def test_decode_attention_is_the_reference(dtype: torch.dtype, window: int | None, heads: int) -> None:
    kv, tables, lens = _pool(dtype)
    q = torch.randn(3, heads, 64, generator=torch.Generator().manual_seed(6)).to(dtype)
    assert cpu_rows.takes_attention(q, kv)
    out = cpu_rows.decode_attention(q, kv, tables, lens, 0.125, window)
    expected = paged_decode_attention_ref(q, kv, tables, lens, 0.125, None, window)
    tolerance = dict(rtol=1e-5, atol=1e-6) if dtype == torch.float32 else dict(rtol=1e-2, atol=1e-2)
    torch.testing.assert_close(out.float(), expected.float(), **tolerance)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_store_kv_writes_the_slots_and_nothing_else(dtype: torch.dtype) -> None:
    kv, _, _ = _pool(dtype)
    generator = torch.Generator().manual_seed(7)
    k, v = (torch.randn(4, 2, 64, generator=generator).to(dtype) for _ in range(2))
    slots = torch.tensor([3, 40, 41, 319])
    ours, theirs = kv.clone(), kv.clone()
    cpu_rows.store_kv(k, v, ours, slots)
    store_kv_ref(k, v, theirs, slots)
    assert torch.equal(ours, theirs) and not torch.equal(ours, kv)


def test_a_head_dim_the_kernel_cannot_take_goes_to_torch() -> None:
    kv = torch.randn(2, 4, 16, 1, 12)
    assert not cpu_rows.takes_attention(torch.randn(1, 2, 12), kv)  # 12: not a multiple of 8
    assert not cpu_rows.takes_attention(torch.randn(1, 2, 12), kv.transpose(3, 4))  # a pool that is not contiguous


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rotary_rotates_q_and_k_in_place_in_their_qkv_row_and_leaves_v(dtype: torch.dtype) -> None:
    generator = torch.Generator().manual_seed(8)
    qkv = torch.randn(3, (6 + 2 + 2) * 64, generator=generator).to(dtype)  # 6 query heads, 2 KV heads, d = 64
    q, k, v = qkv[:, :384].view(3, 6, 64), qkv[:, 384:512].view(3, 2, 64), qkv[:, 512:].clone()
    cos, sin = (torch.randn(3, 32, generator=generator).to(dtype) for _ in range(2))
    expected_q, expected_k = rotary_ref(q.clone(), k.clone(), cos, sin)
    assert cpu_rows.takes_rotary(q, k, cos)
    rotated_q, rotated_k = cpu_rows.rotary(q, k, cos, sin)
    assert rotated_q.data_ptr() == q.data_ptr() and torch.equal(qkv[:, 512:], v)
    # float32 inside, one rounding; the reference computes in q's dtype (bf16: a rounding per product)
    tolerance = dict(rtol=1e-5, atol=1e-5) if dtype == torch.float32 else dict(rtol=1e-2, atol=4e-2)
    torch.testing.assert_close(rotated_q.float(), expected_q.float(), **tolerance)
    torch.testing.assert_close(rotated_k.float(), expected_k.float(), **tolerance)



def test_rotary_of_q_and_k_apart_is_the_same_rotation() -> None:
    """q and k in tensors of their own (after Qwen3's per-head norms): two calls, the same values."""
    generator = torch.Generator().manual_seed(9)
    q, k = torch.randn(2, 4, 32, generator=generator), torch.randn(2, 2, 32, generator=generator)
    cos, sin = (torch.randn(2, 16, generator=generator) for _ in range(2))
    expected_q, expected_k = rotary_ref(q.clone(), k.clone(), cos, sin)
    rotated_q, rotated_k = cpu_rows.rotary(q, k, cos, sin)
    torch.testing.assert_close(rotated_q, expected_q, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(rotated_k, expected_k, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("activation", ["silu", "gelu_tanh"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_glu_is_the_reference(dtype: torch.dtype, activation: str) -> None:
    gate_up = (3 * torch.randn(3, 2 * 200, generator=torch.Generator().manual_seed(2))).to(dtype)
    out = cpu_rows.glu(gate_up, activation)
    assert out.shape == (3, 200) and out.dtype == dtype
    expected = glu_ref(gate_up, activation)
    if dtype == torch.float32:
        torch.testing.assert_close(out, expected, rtol=2e-6, atol=2e-6)
    else:  # the activation's float32 ulps may tip a bf16 rounding either way: one step of it at most, and rarely
        step = expected.float().abs().clamp_min(1e-3) * 2**-7
        assert ((out.float() - expected.float()).abs() <= step).all()
        assert (out != expected).float().mean() < 0.02
    torch.testing.assert_close(ops.glu(gate_up, activation), out, rtol=0, atol=0)
