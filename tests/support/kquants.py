"""Q4_K and Q6_K blocks from float weights, which the `gguf` package cannot make (it only reads them): a plain
round-to-nearest in llama.cpp's byte layouts (not its error-minimizing search), enough for test files. The
layouts are the ones `gguf.quants` dequantizes (engine/model/gguf_blocks.py describes Q4_K's)."""

import numpy as np

SUPER_BLOCK = 256


def _fp16(values: np.ndarray) -> np.ndarray:
    """float32 [..., 1] as fp16, and the 2 bytes of each."""
    return values.astype(np.float16).view(np.uint8)


def quantize_q4_k(weight: np.ndarray) -> np.ndarray:
    """weight [N, K] (K a multiple of 256) -> [N, K/256 · 144] uint8: d, dmin, 12 scale/min bytes, 128 code bytes."""
    rows, cols = weight.shape
    sub = weight.astype(np.float32).reshape(rows, cols // SUPER_BLOCK, 8, 32)
    low = np.minimum(sub.min(axis=-1), 0)  # w = d · sc · q − dmin · m: the min is subtracted, so ≤ 0
    scale, offset = (sub.max(axis=-1) - low) / 15, -low  # [N, B, 8]
    d = (scale.max(axis=-1, keepdims=True) / 63).astype(np.float16).astype(np.float32)  # [N, B, 1]
    dmin = (offset.max(axis=-1, keepdims=True) / 63).astype(np.float16).astype(np.float32)
    with np.errstate(divide="ignore", invalid="ignore"):
        sc = np.nan_to_num(np.round(scale / d)).clip(0, 63).astype(np.uint8)
        m = np.nan_to_num(np.round(offset / dmin)).clip(0, 63).astype(np.uint8)
        step, zero = (d * sc)[..., None], (dmin * m)[..., None]
        q = np.nan_to_num(np.round((sub + zero) / step)).clip(0, 15).astype(np.uint8)  # [N, B, 8, 32]
    scale_min = np.concatenate([(sc[..., :4] & 0x3F) | (sc[..., 4:] >> 4 << 6),
                                (m[..., :4] & 0x3F) | (m[..., 4:] >> 4 << 6),
                                (sc[..., 4:] & 0x0F) | ((m[..., 4:] & 0x0F) << 4)], axis=-1)  # [N, B, 12]
    pairs = q.reshape(rows, -1, 4, 2, 32)  # run r of 32 bytes: sub-block 2r low, 2r + 1 high
    codes = (pairs[..., 0, :] | pairs[..., 1, :] << 4).reshape(rows, -1, 128)
    blocks = np.concatenate([_fp16(d), _fp16(dmin), scale_min, codes], axis=-1)  # [N, B, 144]
    return blocks.reshape(rows, -1)


def quantize_q6_k(weight: np.ndarray) -> np.ndarray:
    """weight [N, K] (K a multiple of 256) -> [N, K/256 · 210] uint8: 128 bytes of low nibbles, 64 of high 2-bit
    pairs, 16 int8 scales of 16 weights each, fp16 d; w = d · scale_j · (q − 32), q in 0..63."""
    rows, cols = weight.shape
    sub = weight.astype(np.float32).reshape(rows, cols // SUPER_BLOCK, 16, 16)
    scale = np.abs(sub).max(axis=-1) / 31  # [N, B, 16]
    d = (scale.max(axis=-1, keepdims=True) / 127).astype(np.float16).astype(np.float32)
    with np.errstate(divide="ignore", invalid="ignore"):
        sc = np.nan_to_num(np.round(scale / d)).clip(-128, 127).astype(np.int8)
        step = (d * sc)[..., None]
        q = (np.nan_to_num(np.round(sub / step)).clip(-32, 31) + 32).astype(np.uint8).reshape(rows, -1, 2, 128)
    low, high = q & 0x0F, q >> 4  # per half of 128: the low nibbles of 64 bytes, the top bits of 32 bytes
    ql = (low[..., :64] | low[..., 64:] << 4).reshape(rows, -1, 128)
    runs = high.reshape(rows, -1, 2, 4, 32)  # run k of 32 weights: bits 2k, 2k + 1 of its 32 bytes
    shifts = np.array([0, 2, 4, 6], dtype=np.uint8)[:, None]
    qh = np.bitwise_or.reduce(runs << shifts, axis=-2).reshape(rows, -1, 64)
    blocks = np.concatenate([ql, qh, sc.view(np.uint8), _fp16(d)], axis=-1)  # [N, B, 210]
    return blocks.reshape(rows, -1)
