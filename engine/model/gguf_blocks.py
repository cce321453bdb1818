"""A GGUF's 4-bit blocks read as int4 codes, scales and zeros, with no float round trip of the weights.

llama.cpp stores a matrix row by row in blocks of 32 consecutive inputs. Per block:
- Q4_0: d (fp16), then 16 bytes of codes q in 0..15; w = d · (q − 8);
- Q4_1: d, m (fp16), then 16 bytes of codes; w = d · q + m.
The 16 bytes hold inputs 0–15 in their low nibbles and 16–31 in their high ones. Both are the int4 layout of
`kernels/quantized_linear` with groups of 32, scale d and zero m + 8d (Q4_1) or 0 (Q4_0).
"""

from dataclasses import dataclass
from pathlib import Path

import gguf
import numpy as np
import torch

from fleetctl.engine.model.gguf_convert import GGUFConvertError, unpermute_rotary
from fleetctl.engine.model.store import SOURCE_GGUF

BLOCK = 32
INT4_TYPES = {gguf.GGMLQuantizationType.Q4_0: 18, gguf.GGMLQuantizationType.Q4_1: 20}  # bytes per block


@dataclass(frozen=True)
class Int4Blocks:
    """One matrix's blocks in Hugging Face's row order: w = (codes − 8) · scales + zeros per block of 32."""

    codes: torch.Tensor  # [N, K] uint8, 0..15
    scales: torch.Tensor  # [N, K/32] float32 (the fp16 d, exactly)
    zeros: torch.Tensor  # [N, K/32] float32

    @classmethod
    def stacked(cls, parts: "list[Int4Blocks]") -> "Int4Blocks":
        """The rows of `parts` one after another (a fused Q/K/V or gate/up matrix)."""
        return cls(torch.cat([p.codes for p in parts]), torch.cat([p.scales for p in parts]),
                   torch.cat([p.zeros for p in parts]))

    def dequantize(self) -> torch.Tensor:
        """float32 [N, K], computed as llama.cpp defines each block (tests compare it with `gguf`'s own)."""
        return (self.codes.float() - 8) * self.scales.repeat_interleave(BLOCK, 1) + self.zeros.repeat_interleave(
            BLOCK, 1)


def read_int4_blocks(tensor: gguf.ReaderTensor, heads: int | None = None) -> Int4Blocks:
    """The blocks of a Q4_0/Q4_1 tensor; `heads` un-permutes a Q or K projection's rows (llama.cpp's RoPE order)."""
    block_bytes = INT4_TYPES.get(tensor.tensor_type)
    if block_bytes is None:
        raise GGUFConvertError(f"tensor {tensor.name} is {tensor.tensor_type.name}, not a 4-bit block type")
    cols, rows = (int(d) for d in tensor.shape)  # GGUF dims run innermost first
    raw = np.asarray(tensor.data, dtype=np.uint8).reshape(rows, cols // BLOCK, block_bytes)
    d = raw[..., 0:2].copy().view(np.float16)[..., 0].astype(np.float32)  # [N, K/32]
    if tensor.tensor_type is gguf.GGMLQuantizationType.Q4_1:
        m = raw[..., 2:4].copy().view(np.float16)[..., 0].astype(np.float32)
        zeros, packed = m + 8 * d, raw[..., 4:]
    else:
        zeros, packed = np.zeros_like(d), raw[..., 2:]
    codes = np.concatenate([packed & 0x0F, packed >> 4], axis=-1).reshape(rows, cols)  # [N, K]
    if heads is not None:
        codes, d, zeros = (unpermute_rotary(a, heads) for a in (codes, d, zeros))
    return Int4Blocks(torch.from_numpy(np.ascontiguousarray(codes)), torch.from_numpy(np.ascontiguousarray(d)),
                      torch.from_numpy(np.ascontiguousarray(zeros)))


def source_gguf(model_dir: Path) -> Path | None:
    """The GGUF a model directory was converted from, when `models pull` kept it there."""
    path = model_dir / SOURCE_GGUF
    return path if path.is_file() else None

