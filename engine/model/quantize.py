"""Which weight format an engine serves, and its linear layers laid out in it.

The decoder layers' matrices (fused Q/K/V, O, fused gate/up, down) change format; the embedding, the norms and
the KV cache stay in the model's dtype. The lm_head does too, except in a layout taken from a GGUF on a CPU where the
GGUF ships the head (or the embedding it is tied to) in Q8_0: then it is those very blocks (int8 in blocks of 32,
the streaming kernel's), as llama.cpp computes with them — half the bytes of a bfloat16 head, which is most of a
small model's decode step.

int4 in groups of 32 (the 4-bit blocks' size) comes from a pulled model's own GGUF where that GGUF ships a
layer matrix in a 4-bit block type (Q4_0, Q4_1, Q4_K): the engine then multiplies by the very weights the file
ships. A matrix shipped in another type (a Q4_K_M file's Q6_K attn_v and ffn_down, a Q8_0) is rounded to nearest
from the model's float weights, part by part of a fused matrix. Likewise int8 from a GGUF that ships layer
matrices in 5- or 8-bit blocks (Q8_0, Q5_0, Q5_1): those blocks and any 4-bit ones as shipped, in int8-split
(8-bit codes per group of 32, as the file has them), a Q6_K part rounded to nearest in groups of 32. Any other
directory, or another group size, is quantized round-to-nearest from the float weights throughout, int8 per
output channel (`kernels/quantized_linear`).
"""

import functools
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TypeVar

import gguf
import torch

from fleetctl.domain import Quantization
from fleetctl.engine.model.gguf_blocks import (
    BLOCK,
    INT4_TYPES,
    INT8_TYPES,
    Int4Blocks,
    Int8Blocks,
    read_int4_blocks,
    read_int8_blocks,
    source_gguf,
)
from fleetctl.engine.model.gguf_params import field
from fleetctl.engine.model.model_config import ModelConfig
from fleetctl.engine.model.weights import Matrix, ModelWeights
from fleetctl.errors import UserError
from fleetctl.kernels.quantized_linear import (
    QuantizationError,
    QuantizedWeight,
    int4_from_codes,
    int8_blocks,
    int8_split,
    quantize_int4,
    quantize_int8,
    round_int4,
    round_int8_groups,
)

# the GGUF tensors behind each fused matrix of a layer, in the order they are stacked
_GGUF_PARTS = {"qkv": ("attn_q", "attn_k", "attn_v"), "o_proj": ("attn_output",), "gate_up": ("ffn_gate", "ffn_up"),
               "down": ("ffn_down",)}
MATRICES = tuple(_GGUF_PARTS)
_GGUF_HEADS = ("output.weight", "token_embd.weight")  # the head's tensor: its own, else the embedding it is tied to
AUTO_INT4_SHARE = 0.75  # auto is int4 when the GGUF ships at least this share of the layer weights in 4 bits
SPLIT_TYPES = {**INT4_TYPES, **INT8_TYPES}  # what int8-split holds exactly
Blocks = TypeVar("Blocks", Int4Blocks, Int8Blocks)
Matrices = Mapping[str, gguf.ReaderTensor]


@dataclass(frozen=True)
class GGUFMatrices:
    """A kept GGUF's layer matrices by name, and whether it stores Q/K rows in llama.cpp's RoPE order (it does
    for its `llama` architecture only)."""

    tensors: Matrices
    rotary_permuted: bool = False
    head: gguf.ReaderTensor | None = None  # the lm_head's tensor (output.weight, else the tied token_embd.weight)


def resolve_quantization(asked: Quantization, model_dir: Path) -> Quantization:
    if asked is not Quantization.AUTO:
        return asked
    matrices = _gguf_layer_matrices(model_dir).tensors
    return Quantization.INT4 if matrices and _shipped_share(matrices, INT4_TYPES) >= AUTO_INT4_SHARE else \
        Quantization.NONE


def weight_source(quantization: Quantization, group_size: int, model_dir: Path) -> str:
    """Names the layout for caches and salts: `none`, `int8`, `int4-g64`, `int4-gguf` (every layer matrix as the
    GGUF ships it) or `int4-gguf-mixed` (its 4-bit ones as shipped, the others rounded to nearest); `int8-gguf`
    and `int8-gguf-mixed` likewise for a GGUF that ships layer matrices in 5- or 8-bit blocks (int8-split)."""
    matrices = _gguf_layer_matrices(model_dir).tensors
    if quantization is Quantization.INT4:
        if group_size == BLOCK and _ships(matrices, INT4_TYPES):
            return "int4-gguf" if _shipped_share(matrices, INT4_TYPES) == 1 else "int4-gguf-mixed"
        return f"int4-g{group_size}"
    if quantization is Quantization.INT8 and _ships(matrices, INT8_TYPES):
        return "int8-gguf" if _shipped_share(matrices, SPLIT_TYPES) == 1 else "int8-gguf-mixed"
    return quantization.value


def quantize_weights(weights: ModelWeights, quantization: Quantization, group_size: int, model_dir: Path,
                     config: ModelConfig) -> ModelWeights:
    """The layers' matrices in `quantization` (not AUTO: resolve first); weights as they are for NONE."""
    try:
        return _quantized(weights, quantization, group_size, model_dir, config)
    except QuantizationError as exc:
        raise UserError(f"--quantization {quantization}: {exc}") from None


def _quantized(weights: ModelWeights, quantization: Quantization, group_size: int, model_dir: Path,
               config: ModelConfig) -> ModelWeights:
    if quantization is Quantization.NONE:
        return weights
    matrices = _gguf_layer_matrices(model_dir)
    if quantization is Quantization.INT8:
        if not _ships(matrices.tensors, INT8_TYPES):
            return _map_matrices(weights, lambda _i, _name, w: quantize_int8(w))

        def int8_from_gguf(index: int, name: str, dense: torch.Tensor) -> QuantizedWeight:
            parts = _gguf_parts(matrices, config, index, name, dense, SPLIT_TYPES, read_int8_blocks,
                                lambda rows: Int8Blocks(*round_int8_groups(rows)))
            blocks = Int8Blocks.stacked(parts)
            _check_blocks(blocks.codes, dense, f"layer {index} {name}")
            return int8_split(blocks.codes, blocks.scales, blocks.offsets, dense.dtype)

        return _gguf_head(_map_matrices(weights, int8_from_gguf), matrices)
    if group_size != BLOCK or not _ships(matrices.tensors, INT4_TYPES):
        return _map_matrices(weights, lambda _i, _name, w: quantize_int4(w, group_size))

    def int4_from_gguf(index: int, name: str, dense: torch.Tensor) -> QuantizedWeight:
        parts = _gguf_parts(matrices, config, index, name, dense, INT4_TYPES, read_int4_blocks,
                            lambda rows: Int4Blocks(*round_int4(rows, BLOCK)))
        blocks = Int4Blocks.stacked(parts)
        _check_blocks(blocks.codes, dense, f"layer {index} {name}")
        return int4_from_codes(blocks.codes, blocks.scales.to(dense.dtype), blocks.zeros.to(dense.dtype), BLOCK)

    return _gguf_head(_map_matrices(weights, int4_from_gguf), matrices)


def _gguf_head(weights: ModelWeights, matrices: GGUFMatrices) -> ModelWeights:
    """The weights with the GGUF's own Q8_0 head, on a CPU (where the streaming kernel multiplies by it); as they
    are elsewhere, or where the GGUF's head is in another type."""
    head, dense = matrices.head, weights.lm_head
    if head is None or head.tensor_type is not gguf.GGMLQuantizationType.Q8_0 or not isinstance(dense, torch.Tensor) \
            or dense.device.type != "cpu":
        return weights
    blocks = read_int8_blocks(head)
    _check_blocks(blocks.codes, dense, "the lm_head")
    return replace(weights, lm_head=int8_blocks(blocks.codes, blocks.scales, dense.dtype))


def _gguf_parts(matrices: GGUFMatrices, config: ModelConfig, index: int, name: str, dense: torch.Tensor,
                shipped: Mapping[gguf.GGMLQuantizationType, object],
                read: Callable[[gguf.ReaderTensor, int | None], Blocks],
                rounded: Callable[[torch.Tensor], Blocks]) -> list[Blocks]:
    """Each part of layer `index`'s fused matrix `name` from its blocks where the GGUF ships it in a `shipped`
    type, else rounded to nearest from its rows of `dense` [N, K]."""
    heads = {"attn_q": config.num_heads, "attn_k": config.num_kv_heads} if matrices.rotary_permuted else {}
    parts, start = [], 0
    for part in _GGUF_PARTS[name]:
        key = f"blk.{index}.{part}.weight"
        tensor = matrices.tensors.get(key)
        if tensor is None:
            raise QuantizationError(f"the GGUF has no {key}")
        cols, rows = (int(d) for d in tensor.shape)  # GGUF dims run innermost first
        if cols != dense.shape[1]:
            raise QuantizationError(f"GGUF tensor {key} has {cols} inputs, the weights {dense.shape[1]}")
        if tensor.tensor_type in shipped:
            parts.append(read(tensor, heads.get(part)).to(dense.device))
        else:
            parts.append(rounded(dense[start:start + rows]))
        start += rows
    return parts


def _check_blocks(codes: torch.Tensor, dense: torch.Tensor, what: str) -> None:
    if codes.shape != dense.shape:
        raise QuantizationError(f"GGUF blocks of {what} are {tuple(codes.shape)}, the weights {tuple(dense.shape)}")


def _map_matrices(weights: ModelWeights, convert: Callable[[int, str, torch.Tensor], Matrix]) -> ModelWeights:
    layers = [replace(layer, **{name: convert(i, name, getattr(layer, name)) for name in MATRICES})
              for i, layer in enumerate(weights.layers)]
    return replace(weights, layers=layers)


def _gguf_layer_matrices(model_dir: Path) -> GGUFMatrices:
    """The kept GGUF's layer matrices (none without a kept GGUF)."""
    path = source_gguf(model_dir)
    if path is None:
        return GGUFMatrices({})
    stat = path.stat()
    return _read_layer_matrices(path.resolve(), stat.st_mtime_ns, stat.st_size)


@functools.lru_cache(maxsize=2)
def _read_layer_matrices(path: Path, _mtime_ns: int, _size: int) -> GGUFMatrices:
    """One read of a GGUF per version of the file for an engine's load (its format, cache name and layout all
    ask); the tensors' data stay memory-mapped while cached."""
    names = {part for parts in _GGUF_PARTS.values() for part in parts}
    reader = gguf.GGUFReader(path)
    tensors = {t.name: t for t in reader.tensors if t.name.startswith("blk.") and t.name.split(".")[2] in names}
    heads = {t.name: t for t in reader.tensors if t.name in _GGUF_HEADS}
    head = next((heads[name] for name in _GGUF_HEADS if name in heads), None)
    return GGUFMatrices(tensors, rotary_permuted=field(reader, "general.architecture") == "llama", head=head)


def _ships(matrices: Matrices, types: Mapping[gguf.GGMLQuantizationType, object]) -> bool:
    """Whether any layer matrix ships in one of `types`."""
    return any(t.tensor_type in types for t in matrices.values())


def _shipped_share(matrices: Matrices, types: Mapping[gguf.GGMLQuantizationType, object]) -> float:
    """The share of the layer matrices' weights that the GGUF ships in `types`."""
    shipped = sum(int(t.n_elements) for t in matrices.values() if t.tensor_type in types)
    return shipped / sum(int(t.n_elements) for t in matrices.values())
