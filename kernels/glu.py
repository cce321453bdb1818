"""Gated MLP activations over a fused [gate | up] projection: SwiGLU, silu(gate) * up (Llama, Qwen, Phi-3),
and GeGLU, gelu_tanh(gate) * up (Gemma). Torch reference and one Triton kernel for both."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F

from fleetctl.kernels.triton_support import kernel, next_pow2

if TYPE_CHECKING:
    import triton.language as tl

GATES = ("silu", "gelu_tanh")  # a model config's activation names (families.base.Activation's values)


def glu_ref(gate_up: torch.Tensor, activation: str = "silu") -> torch.Tensor:
    """gate_up: [T, 2I] -> act(gate) * up [T, I]; `activation` one of GATES."""
    gate, up = gate_up.chunk(2, dim=-1)
    if activation == "silu":
        return F.silu(gate) * up
    if activation == "gelu_tanh":
        return F.gelu(gate, approximate="tanh") * up
    raise ValueError(f"unknown gate activation {activation!r}; known: {', '.join(GATES)}")


@kernel
def _glu_kernel(
    x_ptr,  # [T, 2I]
    out_ptr,  # [T, I]
    n_cols,  # I
    stride_x,
    stride_out,
    GELU: tl.constexpr,
    BLOCK: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < n_cols
    gate = tl.load(x_ptr + row * stride_x + cols, mask=mask, other=0.0).to(tl.float32)
    up = tl.load(x_ptr + row * stride_x + n_cols + cols, mask=mask, other=0.0).to(tl.float32)
    # both are x * sigmoid(z): silu with z = x; gelu's tanh form, 0.5x(1 + tanh(y)), with z = 2y
    z = gate
    if GELU:
        z = 1.5957691216057308 * (gate + 0.044715 * gate * gate * gate)  # 2·sqrt(2/π)
    # round the activation to the model dtype before the product, as the two torch ops do
    act = (gate / (1.0 + tl.exp(-z))).to(out_ptr.dtype.element_ty).to(tl.float32)
    tl.store(out_ptr + row * stride_out + cols, (act * up).to(out_ptr.dtype.element_ty), mask=mask)


def glu_triton(gate_up: torch.Tensor, activation: str = "silu") -> torch.Tensor:
    """gate_up: [T, 2I] -> act(gate) * up [T, I]."""
    if activation not in GATES:
        raise ValueError(f"unknown gate activation {activation!r}; known: {', '.join(GATES)}")
    width = gate_up.shape[-1]
    x = gate_up.reshape(-1, width)
    if x.stride(-1) != 1:
        x = x.contiguous()
    inner = width // 2
    out = torch.empty(x.shape[0], inner, dtype=gate_up.dtype, device=gate_up.device)
    if x.shape[0]:
        block = min(next_pow2(inner), 2048)
        grid = (x.shape[0], -(-inner // block))
        warps = 4 if block <= 1024 else 8
        _glu_kernel[grid](x, out, inner, x.stride(0), out.stride(0), GELU=activation == "gelu_tanh", BLOCK=block,
                          num_warps=warps)
    return out.view(*gate_up.shape[:-1], inner)
