"""KV in 8 bits (`--kv-dtype int8`): how an int8 pool stores a key or a value, and the torch reference of both ways.

A pool of int8 KV holds, per (token, KV head), the head's d values as int8 codes followed by their scale, a
bfloat16 in two bytes: a row of `d + SCALE_BYTES` int8 where a 16-bit pool has d values. The scale is per row
(finer than per block and head) so a token is quantized once, when it is written, and never again as its block
fills: scale = bf16(max |x| / 127), code = clamp(round_half_even(x / scale), -127, 127), x ~ code * scale (a row of
zeros: scale 0, codes 0). Everything that moves blocks (handoffs, moves, checkpoints, tiers) moves these rows as
they are, so the bytes on every wire are the 8-bit ones; only the KV store and the attention kernels read them.

At head_dim 64 a row is 66 bytes against bf16's 128 (0.52x; 1.94x the tokens per GiB).
"""

import torch

SCALE_BYTES = 2  # the row's scale, a bfloat16
LEVELS = 127.0  # codes in [-127, 127]: symmetric, so -x quantizes to -code


def stored_width(head_dim: int) -> int:
    """Int8 values a (token, KV head) row takes in an int8 pool."""
    return head_dim + SCALE_BYTES


def quantize_rows(x: torch.Tensor) -> torch.Tensor:
    """x [..., d] (any float dtype) -> int8 [..., d + SCALE_BYTES]: each row's codes, then its scale's bytes."""
    values = x.float()
    scale = (values.abs().amax(dim=-1, keepdim=True) / LEVELS).to(torch.bfloat16)
    divisor = scale.float()
    codes = torch.where(divisor > 0, values / divisor.clamp(min=torch.finfo(torch.float32).tiny), 0.0)
    codes = codes.round().clamp(-LEVELS, LEVELS).to(torch.int8)
    return torch.cat([codes, scale.view(torch.int8).reshape(*codes.shape[:-1], SCALE_BYTES)], dim=-1)


def dequantize_rows(rows: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """int8 rows [..., d + SCALE_BYTES] -> [..., d] in `dtype` (each value code * scale in float32, rounded once)."""
    head_dim = rows.shape[-1] - SCALE_BYTES
    scale = rows[..., head_dim:].contiguous().view(torch.bfloat16).float()
    return (rows[..., :head_dim].float() * scale).to(dtype)
