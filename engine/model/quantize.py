"""Which weight format an engine serves, and its linear layers laid out in it.

Only the decoder layers' matrices (fused Q/K/V, O, fused gate/up, down) change format; the embedding, the
norms, the lm_head (tied to the embedding in most small models) and the KV cache stay in the model's dtype.

int4 in groups of 32 (the 4-bit blocks' size) comes from a pulled model's own GGUF where that GGUF ships a
layer matrix in a 4-bit block type (Q4_0, Q4_1, Q4_K): the engine then multiplies by the very weights the file
ships. A matrix shipped in another type (a Q4_K_M file's Q6_K attn_v and ffn_down, a Q8_0) is rounded to nearest
from the model's float weights, part by part of a fused matrix. Any other directory, or another group size, is
quantized round-to-nearest from the float weights throughout (`kernels/quantized_linear`).
"""

import functools
from collections.abc import Callable, Mapping
from dataclasses import replace
from pathlib import Path

import gguf
import torch

from fleetctl.domain import Quantization
from fleetctl.engine.model.config import ModelConfig
from fleetctl.engine.model.decoder import Matrix, ModelWeights
from fleetctl.engine.model.gguf_blocks import BLOCK, INT4_TYPES, Int4Blocks, read_int4_blocks, source_gguf
from fleetctl.engine.model.weight_errors import WeightLoadError
from fleetctl.kernels.quantized_linear import (
    QuantizationError,
    QuantizedWeight,
    int4_from_codes,
    quantize_int4,
    quantize_int8,
    round_int4,
)

# the GGUF tensors behind each fused matrix of a layer, in the order they are stacked
_GGUF_PARTS = {"qkv": ("attn_q", "attn_k", "attn_v"), "o_proj": ("attn_output",), "gate_up": ("ffn_gate", "ffn_up"),
               "down": ("ffn_down",)}
MATRICES = tuple(_GGUF_PARTS)
AUTO_INT4_SHARE = 0.75  # auto is int4 when the GGUF ships at least this share of the layer weights in 4 bits


def resolve_quantization(asked: Quantization, model_dir: Path) -> Quantization:
    if asked is not Quantization.AUTO:
        return asked
    matrices = _gguf_layer_matrices(model_dir)
    return Quantization.INT4 if matrices is not None and _shipped_share(matrices) >= AUTO_INT4_SHARE else \
        Quantization.NONE


def weight_source(quantization: Quantization, group_size: int, model_dir: Path) -> str:
    """Names the layout for caches and salts: `none`, `int8`, `int4-g64`, `int4-gguf` (every layer matrix as the
    GGUF ships it) or `int4-gguf-mixed` (its 4-bit ones as shipped, the others rounded to nearest)."""
    if quantization is Quantization.INT4:
        matrices = _gguf_layer_matrices(model_dir) if group_size == BLOCK else None
        if matrices is not None:
            return "int4-gguf" if _shipped_share(matrices) == 1 else "int4-gguf-mixed"
        return f"int4-g{group_size}"
    return quantization.value


def quantize_weights(weights: ModelWeights, quantization: Quantization, group_size: int, model_dir: Path,
                     config: ModelConfig) -> ModelWeights:
    """The layers' matrices in `quantization` (not AUTO: resolve first); weights as they are for NONE."""
    try:
        return _quantized(weights, quantization, group_size, model_dir, config)
    except QuantizationError as exc:
        raise WeightLoadError(f"--quantization {quantization}: {exc}") from None


def _quantized(weights: ModelWeights, quantization: Quantization, group_size: int, model_dir: Path,
               config: ModelConfig) -> ModelWeights:
    if quantization is Quantization.NONE:
        return weights
    if quantization is Quantization.INT8:
        return _map_matrices(weights, lambda _i, _name, w: quantize_int8(w))
    matrices = _gguf_layer_matrices(model_dir) if group_size == BLOCK else None
    if matrices is None:
        return _map_matrices(weights, lambda _i, _name, w: quantize_int4(w, group_size))
    heads = {"attn_q": config.num_heads, "attn_k": config.num_kv_heads}

    def from_gguf(index: int, name: str, dense: torch.Tensor) -> QuantizedWeight:
        """Each part of the fused matrix from its shipped 4-bit blocks, else rounded from its rows of `dense`."""
        parts, start = [], 0
        for part in _GGUF_PARTS[name]:
            key = f"blk.{index}.{part}.weight"
            tensor = matrices.get(key)
            if tensor is None:
                raise QuantizationError(f"the GGUF has no {key}")
            cols, rows = (int(d) for d in tensor.shape)  # GGUF dims run innermost first
            if cols != dense.shape[1]:
                raise QuantizationError(f"GGUF tensor {key} has {cols} inputs, the weights {dense.shape[1]}")
            if tensor.tensor_type in INT4_TYPES:
                parts.append(read_int4_blocks(tensor, heads.get(part)).to(dense.device))
            else:
                parts.append(Int4Blocks(*round_int4(dense[start:start + rows], BLOCK)))
            start += rows
        blocks = Int4Blocks.stacked(parts)
        if blocks.codes.shape != dense.shape:
            raise QuantizationError(f"GGUF blocks of layer {index} {name} are {tuple(blocks.codes.shape)}, "
                                    f"the weights {tuple(dense.shape)}")
        return int4_from_codes(blocks.codes, blocks.scales.to(dense.dtype), blocks.zeros.to(dense.dtype), BLOCK)

    return _map_matrices(weights, from_gguf)


def _map_matrices(weights: ModelWeights, convert: Callable[[int, str, torch.Tensor], Matrix]) -> ModelWeights:
    layers = [replace(layer, **{name: convert(i, name, getattr(layer, name)) for name in MATRICES})
              for i, layer in enumerate(weights.layers)]
    return replace(weights, layers=layers)


def _gguf_layer_matrices(model_dir: Path) -> Mapping[str, gguf.ReaderTensor] | None:
    """The kept GGUF's layer matrices by name when it ships any in a 4-bit block type; None otherwise."""
    path = source_gguf(model_dir)
    if path is None:
        return None
    stat = path.stat()
    return _read_layer_matrices(path.resolve(), stat.st_mtime_ns, stat.st_size)


@functools.lru_cache(maxsize=2)
def _read_layer_matrices(path: Path, _mtime_ns: int, _size: int) -> Mapping[str, gguf.ReaderTensor] | None:
    """One read of a GGUF per version of the file for an engine's load (its format, cache name and layout all
    ask); the tensors' data stay memory-mapped while cached."""
    names = {part for parts in _GGUF_PARTS.values() for part in parts}
    matrices = {t.name: t for t in gguf.GGUFReader(path).tensors
                if t.name.startswith("blk.") and t.name.split(".")[2] in names}
    return matrices if any(t.tensor_type in INT4_TYPES for t in matrices.values()) else None


def _shipped_share(matrices: Mapping[str, gguf.ReaderTensor]) -> float:
    """The share of the layer matrices' weights that the GGUF ships in 4-bit blocks."""
    shipped = sum(int(t.n_elements) for t in matrices.values() if t.tensor_type in INT4_TYPES)
    return shipped / sum(int(t.n_elements) for t in matrices.values())
