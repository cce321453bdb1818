"""The model's math, behind one seam.

Every function here has a torch reference (the fast path on CPU) and a Triton kernel behind the same
signature. `FLEET_KERNELS` selects, once, when this module is first imported (see triton_support):

- `auto` (default): Triton for CUDA tensors when triton is installed; on a CPU this package's C kernels where they
  are built (`cpu_build`: decode's matrix products, RMSNorm, rotary, the KV store, the GLU, decode attention, and
  the whole decode step in one call: `cpu_step`), the torch
  references otherwise;
- `torch`: the references everywhere (no C kernel either);
- `interpret`: the Triton kernels for every tensor, CPU tensors through Triton's interpreter
  (this module sets TRITON_INTERPRET=1 on import, so import it before anything imports triton;
  slow: for tests and debugging).

Importing this module does not import triton: that happens on the first kernel launch.
"""

from collections.abc import Callable
from dataclasses import dataclass

import torch

from fleetctl.errors import FleetctlError
from fleetctl.kernels import cpu_rows, packed_linear, quantized_linear, triton_support
from fleetctl.kernels.batch_invariant import invariant_attention, per_row_tile
from fleetctl.kernels.glu import GATES, glu_ref, glu_triton
from fleetctl.kernels.paged_attention import (
    DecodeKeys,
    decode_keys,
    paged_decode_attention_ref,
    paged_decode_attention_triton,
    prefill_attention_ref,
    prefill_attention_triton,
)
from fleetctl.kernels.rms_norm import rms_norm_ref, rms_norm_triton
from fleetctl.kernels.rotary import RotaryTables, rotary_ref, rotary_triton
from fleetctl.kernels.store_kv import store_kv_ref, store_kv_triton

MODE = triton_support.kernel_mode()
if MODE == "interpret" and not triton_support.triton_available():
    raise FleetctlError(
        "FLEET_KERNELS=interpret needs the `triton` package (pip install triton; Linux only)"
    )
if MODE == "interpret":
    triton_support.use_interpreter()  # before anything imports triton
_TRITON_ON_CUDA = MODE == "auto" and triton_support.triton_available()
_TRITON_EVERYWHERE = MODE == "interpret"

def _use_triton(x: torch.Tensor) -> bool:
    return _TRITON_EVERYWHERE or (_TRITON_ON_CUDA and x.is_cuda)


def backend(device: torch.device) -> str:
    """What computes the row-wise ops and attention on `device`: triton, triton-interpret or torch."""
    if _TRITON_EVERYWHERE:
        return "triton-interpret"
    return "triton" if _TRITON_ON_CUDA and device.type == "cuda" else "torch"


def rms_norm(
    x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """x, residual: [T, D]; weight: [D] -> (normed [T, D], new residual [T, D])."""
    if _use_triton(x):
        return rms_norm_triton(x, weight, eps, residual)
    if cpu_rows.takes(x, weight, residual):
        return cpu_rows.rms_norm(x, weight, eps, residual)
    return rms_norm_ref(x, weight, eps, residual)


def rotary_step_tables(cos: torch.Tensor, sin: torch.Tensor, dtype: torch.dtype) -> RotaryTables | None:
    """What every layer's rotary of one step shares, laid out once (None for the Triton kernel)."""
    if _use_triton(cos):
        return None
    return RotaryTables.of(cos, sin, dtype)


def rotary(
    q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, tables: RotaryTables | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """q: [T, H, d]; k: [T, Hkv, d]; cos, sin: [T, d/2] (the model's dtype); tables: rotary_step_tables of
    them. The Triton path and the CPU's C kernel rotate in place."""
    if _use_triton(q):
        return rotary_triton(q, k, cos, sin)
    if cpu_rows.takes_rotary(q, k, cos):
        return cpu_rows.rotary(q, k, cos, sin)
    return rotary_ref(q, k, cos, sin, tables)


def glu(gate_up: torch.Tensor, activation: str = "silu") -> torch.Tensor:
    """gate_up: [T, 2I] -> act(gate) * up [T, I]; activation: silu (SwiGLU) or gelu_tanh (GeGLU)."""
    if _use_triton(gate_up):
        return glu_triton(gate_up, activation)
    if activation in GATES and cpu_rows.takes_glu(gate_up):
        return cpu_rows.glu(gate_up, activation)
    return glu_ref(gate_up, activation)


def store_kv(k: torch.Tensor, v: torch.Tensor, kv_layer: torch.Tensor, slots: torch.Tensor) -> None:
    """k, v: [T, Hkv, d] into kv_layer [2, blocks, block_size, Hkv, d] at slots [T] int64."""
    if _use_triton(k):
        store_kv_triton(k, v, kv_layer, slots)
    elif cpu_rows.takes_store(k, kv_layer):
        cpu_rows.store_kv(k, v, kv_layer, slots)
    else:
        store_kv_ref(k, v, kv_layer, slots)


def decode_step_keys(
    block_tables: torch.Tensor, context_lens: torch.Tensor, block_size: int, window: int | None = None
) -> DecodeKeys | None:
    """What every layer's decode_attention of one step (and one window) shares, computed once (None for the
    Triton kernel and the CPU's C kernel, which read the block tables themselves)."""
    if _use_triton(block_tables) or cpu_rows.takes_attention_tables(block_tables):
        return None
    return decode_keys(block_tables, context_lens, block_size, window)


def decode_attention(
    q: torch.Tensor,
    kv_layer: torch.Tensor,
    block_tables: torch.Tensor,
    context_lens: torch.Tensor,
    scale: float,
    keys: DecodeKeys | None = None,
    window: int | None = None,
) -> torch.Tensor:
    """q: [B, H, d]; block_tables: [B, max_blocks] int32; context_lens: [B] int32; keys: decode_step_keys
    of those; window: the layer's sliding window (None: full attention) -> [B, H, d]."""
    if _use_triton(q):
        return paged_decode_attention_triton(q, kv_layer, block_tables, context_lens, scale, window=window)
    if keys is None and cpu_rows.takes_attention(q, kv_layer):
        return cpu_rows.decode_attention(q, kv_layer, block_tables, context_lens, scale, window)
    return paged_decode_attention_ref(q, kv_layer, block_tables, context_lens, scale, keys, window)


def prefill_attention(
    q: torch.Tensor,
    kv_layer: torch.Tensor,
    block_tables: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    context_lens: torch.Tensor,
    scale: float,
    window: int | None = None,
) -> torch.Tensor:
    """q: [T, H, d] packed by cu_seqlens_q [B + 1]; context_lens: [B] (cached + new); window: the layer's
    sliding window (None: full attention) -> [T, H, d]."""
    if _use_triton(q):
        return prefill_attention_triton(q, kv_layer, block_tables, cu_seqlens_q, context_lens, scale, window=window)
    return prefill_attention_ref(q, kv_layer, block_tables, cu_seqlens_q, context_lens, scale, window)


def linear(x: torch.Tensor, weight: "torch.Tensor | quantized_linear.QuantizedWeight") -> torch.Tensor:
    """x [T, K] @ weight [N, K]ᵀ -> [T, N]: a dense weight (plain or packed) or a weight-only quantized one."""
    if isinstance(weight, quantized_linear.QuantizedWeight):
        return quantized_linear.linear(x, weight)
    return packed_linear.linear(x, weight)


@dataclass(frozen=True)
class RowOps:
    """The row-wise ops a model runs: the fast ones, or the batch-invariant ones (deterministic mode)."""

    linear: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
    rms_norm: Callable[..., tuple[torch.Tensor, torch.Tensor]]
    rotary: Callable[..., tuple[torch.Tensor, torch.Tensor]]
    glu: Callable[[torch.Tensor, str], torch.Tensor]


FAST = RowOps(linear, rms_norm, rotary, glu)
BATCH_INVARIANT = RowOps(
    linear=lambda x, weight: per_row_tile(lambda rows: linear(rows, weight), x),
    rms_norm=lambda x, weight, eps, residual=None: per_row_tile(
        lambda rows, res: rms_norm(rows, weight, eps, res), x, residual),
    rotary=lambda q, k, cos, sin, tables=None: per_row_tile(rotary, q, k, cos, sin),  # tables: laid out per tile
    glu=lambda gate_up, activation="silu": per_row_tile(lambda rows: glu(rows, activation), gate_up),
)

__all__ = [
    "BATCH_INVARIANT",
    "FAST",
    "MODE",
    "DecodeKeys",
    "RotaryTables",
    "RowOps",
    "backend",
    "decode_attention",
    "decode_step_keys",
    "glu",
    "invariant_attention",
    "linear",
    "prefill_attention",
    "rms_norm",
    "rotary",
    "rotary_step_tables",
    "store_kv",
]
