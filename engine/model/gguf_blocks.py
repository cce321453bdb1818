"""A GGUF's 4-bit blocks read as int4 codes, scales and zeros, and its 5- and 8-bit blocks as signed codes,
scales and offsets, with no float round trip of the weights.

llama.cpp stores a matrix row by row in blocks of consecutive inputs. The 4-bit block types:
- Q4_0 (32 inputs, 18 bytes): d (fp16), then 16 bytes of codes q in 0..15; w = d · (q − 8);
- Q4_1 (32 inputs, 20 bytes): d, m (fp16), then 16 bytes of codes; w = d · q + m.
  In both, the 16 bytes hold inputs 0–15 in their low nibbles and 16–31 in their high ones.
- Q4_K (a super-block of 256 inputs, 144 bytes): d, dmin (fp16); 12 bytes packing a 6-bit scale sc_j and a
  6-bit min m_j for each of 8 sub-blocks of 32 (bytes 0–3: sc_0..3 in their low 6 bits, the top 2 bits of
  sc_4..7 above them; bytes 4–7: m_0..3 likewise with the top bits of m_4..7; bytes 8–11: the low 4 bits of
  sc_4..7, then of m_4..7 in the high nibble); then 128 bytes of codes in 4 runs of 32 bytes, run r holding
  sub-block 2r in its low nibbles and sub-block 2r + 1 in its high ones; w = d · sc_j · q − dmin · m_j.
Each maps onto the int4 layout of `kernels/quantized_linear` (w = (q − 8) · s + z) in groups of 32: Q4_0 is
s = d, z = 0; Q4_1 is s = d, z = m + 8d; each Q4_K sub-block is s = d · sc_j, z = 8 · d · sc_j − dmin · m_j.

The wider blocks (32 inputs each) map onto int8-split (w = q · d + m per group of 32, q in −128..127):
- Q8_0 (34 bytes): d, then 32 int8 codes; w = d · q (m = 0);
- Q5_0 (22 bytes): d, 4 bytes holding bit 4 of each input's code (input j in bit j, little-endian), 16 bytes
  of low nibbles as in Q4_0; w = d · (q − 16);
- Q5_1 (24 bytes): d, m, then as Q5_0; w = d · q + m.
A 4-bit block is int8-split's too (q − 8, offset z). Q6_K is not: its scales change every 16 inputs.

The codes are the file's bytes and s is exact in float32 (d · sc_j: 11 × 6 significant bits). The zero is
rounded to float32 once, where llama.cpp rounds the weight once, so a block dequantizes to exactly its GGUF
value whenever the zero is itself a float32: whenever d and m (dmin) lie within a few binades of each other, as
llama.cpp's quantizers make them (for Q4_K, −10 ≤ exponent(d) − exponent(dmin) ≤ 4 is enough). Otherwise the
zero's rounding (half its float32 ulp) carries into the weight.
"""

from collections.abc import Callable
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Self

import gguf
import numpy as np
import torch

from fleetctl.engine.model.gguf_convert import GGUFConvertError, unpermute_rotary
from fleetctl.engine.model.model_store import SOURCE_GGUF

BLOCK = 32  # inputs per int4 group: a Q4_0/Q4_1 block, a Q4_K sub-block

# codes [N, K] uint8, scales and zeros [N, K/32] float32 from a matrix's blocks [N, blocks per row, block bytes]
BlockReader = Callable[[np.ndarray], tuple[np.ndarray, np.ndarray, np.ndarray]]


@dataclass(frozen=True)
class _Blocks:
    """A matrix's blocks as three row-aligned tensors: codes [N, K], and two [N, K/32] per group of 32."""

    @classmethod
    def stacked(cls, parts: list[Self]) -> Self:
        """The rows of `parts` one after another (a fused Q/K/V or gate/up matrix)."""
        return cls(*(torch.cat([getattr(p, f.name) for p in parts]) for f in fields(cls)))

    def to(self, device: torch.device) -> Self:
        return type(self)(*(getattr(self, f.name).to(device) for f in fields(self)))


@dataclass(frozen=True)
class Int4Blocks(_Blocks):
    """One matrix's blocks in Hugging Face's row order: w = (codes − 8) · scales + zeros per group of 32."""

    codes: torch.Tensor  # [N, K] uint8, 0..15
    scales: torch.Tensor  # [N, K/32] float32 (the fp16 d, or d · sc_j, exactly)
    zeros: torch.Tensor  # [N, K/32] float32

    def dequantize(self) -> torch.Tensor:
        """float32 [N, K] as the int4 layout computes it (tests compare it with `gguf`'s own dequantization)."""
        return (self.codes.float() - 8) * self.scales.repeat_interleave(BLOCK, 1) + self.zeros.repeat_interleave(
            BLOCK, 1)


@dataclass(frozen=True)
class Int8Blocks(_Blocks):
    """One matrix's blocks in Hugging Face's row order: w = codes · scales + offsets per group of 32."""

    codes: torch.Tensor  # [N, K] int16, −128..127
    scales: torch.Tensor  # [N, K/32] float32 (the fp16 d exactly)
    offsets: torch.Tensor  # [N, K/32] float32

    @classmethod
    def from_int4(cls, blocks: Int4Blocks) -> "Int8Blocks":
        return cls(blocks.codes.to(torch.int16) - 8, blocks.scales, blocks.zeros)

    def dequantize(self) -> torch.Tensor:
        """float32 [N, K]: each weight is one exact product plus its offset, as `gguf` computes it."""
        return self.codes.float() * self.scales.repeat_interleave(BLOCK, 1) + self.offsets.repeat_interleave(
            BLOCK, 1)


def _fp16(raw: np.ndarray) -> np.ndarray:
    """The fp16 in the last axis' 2 bytes, as float32 (exactly)."""
    return raw.copy().view(np.float16)[..., 0].astype(np.float32)


def _low_then_high_nibbles(packed: np.ndarray) -> np.ndarray:
    """[N, B, 16] bytes -> codes [N, B · 32]: each block's low nibbles, then its high ones."""
    rows = packed.shape[0]
    return np.concatenate([packed & 0x0F, packed >> 4], axis=-1).reshape(rows, -1)


def _q4_0(raw: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    d = _fp16(raw[..., 0:2])
    return _low_then_high_nibbles(raw[..., 2:]), d, np.zeros_like(d)


def _q4_1(raw: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    d, m = _fp16(raw[..., 0:2]), _fp16(raw[..., 2:4])
    return _low_then_high_nibbles(raw[..., 4:]), d, m + 8 * d


def _q4_k(raw: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rows, blocks = raw.shape[:2]
    d, dmin = _fp16(raw[..., 0:2])[..., None], _fp16(raw[..., 2:4])[..., None]  # [N, B, 1]
    sc_bytes, m_bytes, low_bits = raw[..., 4:8], raw[..., 8:12], raw[..., 12:16]  # [N, B, 4] each
    sc = np.concatenate([sc_bytes & 0x3F, (low_bits & 0x0F) | (sc_bytes >> 6 << 4)], axis=-1)  # [N, B, 8], 0..63
    m = np.concatenate([m_bytes & 0x3F, (low_bits >> 4) | (m_bytes >> 6 << 4)], axis=-1)
    scales = d * sc  # exact
    zeros = 8 * scales - dmin * m  # dmin · m exact, then one rounding
    runs = raw[..., 16:].reshape(rows, blocks, 4, 1, 32)  # run r: sub-blocks 2r (low nibbles) and 2r + 1 (high)
    codes = np.concatenate([runs & 0x0F, runs >> 4], axis=3).reshape(rows, blocks * 256)
    return codes, scales.reshape(rows, -1), zeros.reshape(rows, -1)


def _q8_0(raw: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    d = _fp16(raw[..., 0:2])
    return raw[..., 2:].copy().view(np.int8).astype(np.int16).reshape(raw.shape[0], -1), d, np.zeros_like(d)


def _five_bit_codes(raw: np.ndarray) -> np.ndarray:
    """[N, B, 20] bytes (4 of high bits, 16 of nibbles) -> codes [N, B · 32] in 0..31."""
    high = np.unpackbits(raw[..., :4], axis=-1, bitorder="little").reshape(raw.shape[0], -1)  # input j: bit j
    return _low_then_high_nibbles(raw[..., 4:]).astype(np.int16) | high.astype(np.int16) << 4


def _q5_0(raw: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    d = _fp16(raw[..., 0:2])
    return _five_bit_codes(raw[..., 2:]) - 16, d, np.zeros_like(d)


def _q5_1(raw: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    return _five_bit_codes(raw[..., 4:]), _fp16(raw[..., 0:2]), _fp16(raw[..., 2:4])


# the 4-bit block types: (inputs, bytes) per block, and how its bytes read
INT4_TYPES: dict[gguf.GGMLQuantizationType, tuple[int, int, BlockReader]] = {
    gguf.GGMLQuantizationType.Q4_0: (32, 18, _q4_0),
    gguf.GGMLQuantizationType.Q4_1: (32, 20, _q4_1),
    gguf.GGMLQuantizationType.Q4_K: (256, 144, _q4_k),
}
# the wider block types int8-split holds exactly (4-bit ones too, through Int8Blocks.from_int4)
INT8_TYPES: dict[gguf.GGMLQuantizationType, tuple[int, int, BlockReader]] = {
    gguf.GGMLQuantizationType.Q8_0: (32, 34, _q8_0),
    gguf.GGMLQuantizationType.Q5_0: (32, 22, _q5_0),
    gguf.GGMLQuantizationType.Q5_1: (32, 24, _q5_1),
}


def _read(tensor: gguf.ReaderTensor, types: dict[gguf.GGMLQuantizationType, tuple[int, int, BlockReader]],
          heads: int | None) -> list[torch.Tensor]:
    """codes, scales and zeros (offsets) of a tensor of one of `types`, in Hugging Face's row order."""
    inputs, block_bytes, read = types[tensor.tensor_type]
    cols, rows = (int(d) for d in tensor.shape)  # GGUF dims run innermost first
    arrays = read(np.asarray(tensor.data, dtype=np.uint8).reshape(rows, cols // inputs, block_bytes))
    if heads is not None:
        arrays = tuple(unpermute_rotary(a, heads) for a in arrays)
    return [torch.from_numpy(np.ascontiguousarray(a)) for a in arrays]


def read_int4_blocks(tensor: gguf.ReaderTensor, heads: int | None = None) -> Int4Blocks:
    """The blocks of a 4-bit tensor; `heads` un-permutes a Q or K projection's rows (llama.cpp's RoPE order)."""
    if tensor.tensor_type not in INT4_TYPES:
        raise GGUFConvertError(f"tensor {tensor.name} is {tensor.tensor_type.name}, not a 4-bit block type")
    return Int4Blocks(*_read(tensor, INT4_TYPES, heads))


def read_int8_blocks(tensor: gguf.ReaderTensor, heads: int | None = None) -> Int8Blocks:
    """The blocks of an 8-, 5- or 4-bit tensor as signed codes; `heads` as for `read_int4_blocks`."""
    if tensor.tensor_type in INT4_TYPES:
        return Int8Blocks.from_int4(read_int4_blocks(tensor, heads))
    if tensor.tensor_type not in INT8_TYPES:
        raise GGUFConvertError(f"tensor {tensor.name} is {tensor.tensor_type.name}, not a block type int8 holds")
    return Int8Blocks(*_read(tensor, INT8_TYPES, heads))


def source_gguf(model_dir: Path) -> Path | None:
    """The GGUF a model directory was converted from, when `models pull` kept it there."""
    path = model_dir / SOURCE_GGUF
    return path if path.is_file() else None
