"""Which weight format an engine serves, and its linear layers laid out in it.

Only the decoder layers' matrices (fused Q/K/V, O, fused gate/up, down) change format; the embedding, the
norms, the lm_head (tied to the embedding in most small models) and the KV cache stay in the model's dtype.

int4 comes from a pulled model's own GGUF when that GGUF's matrices are Q4_0/Q4_1 blocks and the groups are
32 (its block size): the engine then multiplies by the very weights the file ships. Any other directory, or
another group size, is quantized round-to-nearest from the float weights (`kernels/quantized_linear`).
"""

from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import gguf
import torch

from fleetctl.domain import Quantization
from fleetctl.engine.model.config import ModelConfig
from fleetctl.engine.model.gguf_blocks import BLOCK, INT4_TYPES, Int4Blocks, read_int4_blocks, source_gguf
from fleetctl.engine.model.llama import LlamaWeights, Matrix
from fleetctl.engine.model.weight_errors import WeightLoadError
from fleetctl.kernels.quantized_linear import (
    QuantizationError,
    QuantizedWeight,
    int4_from_codes,
    quantize_int4,
    quantize_int8,
)

# the GGUF tensors behind each fused matrix of a layer, in the order they are stacked
_GGUF_PARTS = {"qkv": ("attn_q", "attn_k", "attn_v"), "o_proj": ("attn_output",), "gate_up": ("ffn_gate", "ffn_up"),
               "down": ("ffn_down",)}
MATRICES = tuple(_GGUF_PARTS)


def resolve_quantization(asked: Quantization, model_dir: Path) -> Quantization:
    if asked is not Quantization.AUTO:
        return asked
    return Quantization.INT4 if _gguf_int4_tensors(model_dir) is not None else Quantization.NONE


def weight_source(quantization: Quantization, group_size: int, model_dir: Path) -> str:
    """Names the layout for caches and salts: `none`, `int8`, `int4-g64`, or `int4-gguf` (the shipped blocks)."""
    if quantization is Quantization.INT4:
        if group_size == BLOCK and _gguf_int4_tensors(model_dir) is not None:
            return "int4-gguf"
        return f"int4-g{group_size}"
    return quantization.value


def quantize_weights(weights: LlamaWeights, quantization: Quantization, group_size: int, model_dir: Path,
                     config: ModelConfig) -> LlamaWeights:
    """The layers' matrices in `quantization` (not AUTO: resolve first); weights as they are for NONE."""
    try:
        return _quantized(weights, quantization, group_size, model_dir, config)
    except QuantizationError as exc:
        raise WeightLoadError(f"--quantization {quantization}: {exc}") from None


def _quantized(weights: LlamaWeights, quantization: Quantization, group_size: int, model_dir: Path,
               config: ModelConfig) -> LlamaWeights:
    if quantization is Quantization.NONE:
        return weights
    if quantization is Quantization.INT8:
        return _map_matrices(weights, lambda _i, _name, w: quantize_int8(w))
    tensors = _gguf_int4_tensors(model_dir) if group_size == BLOCK else None
    if tensors is None:
        return _map_matrices(weights, lambda _i, _name, w: quantize_int4(w, group_size))
    heads = {"attn_q": config.num_heads, "attn_k": config.num_kv_heads}

    def from_gguf(index: int, name: str, dense: torch.Tensor) -> QuantizedWeight:
        parts = [read_int4_blocks(tensors[f"blk.{index}.{part}.weight"], heads.get(part)) for part in _GGUF_PARTS[name]]
        blocks = Int4Blocks.stacked(parts)
        if blocks.codes.shape != dense.shape:
            raise QuantizationError(f"GGUF blocks of layer {index} {name} are {tuple(blocks.codes.shape)}, "
                             f"the weights {tuple(dense.shape)}")
        device, dtype = dense.device, dense.dtype
        return int4_from_codes(blocks.codes.to(device), blocks.scales.to(device, dtype), blocks.zeros.to(device, dtype),
                               BLOCK)

    return _map_matrices(weights, from_gguf)


def _map_matrices(weights: LlamaWeights, convert: Callable[[int, str, torch.Tensor], Matrix]) -> LlamaWeights:
    layers = [replace(layer, **{name: convert(i, name, getattr(layer, name)) for name in MATRICES})
              for i, layer in enumerate(weights.layers)]
    return replace(weights, layers=layers)


def _gguf_int4_tensors(model_dir: Path) -> dict[str, gguf.ReaderTensor] | None:
    """The kept GGUF's tensors by name when every layer matrix is a 4-bit block type; None otherwise."""
    path = source_gguf(model_dir)
    if path is None:
        return None
    tensors = {t.name: t for t in gguf.GGUFReader(path).tensors}
    layer_matrices = [t for name, t in tensors.items() if name.startswith("blk.") and t.name.split(".")[2] in
                      {part for parts in _GGUF_PARTS.values() for part in parts}]
    if not layer_matrices or any(t.tensor_type not in INT4_TYPES for t in layer_matrices):
        return None
    return tensors

