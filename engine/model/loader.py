"""Load a Hugging Face model directory into ModelWeights (memory-mapped safetensors; no transformers import)."""

import json
from pathlib import Path

import torch
from safetensors import safe_open

from fleetctl.engine.model.families.base import NORM_FIELDS, Shapes, TensorSpec
from fleetctl.engine.model.families.registry import family_named
from fleetctl.engine.model.model_config import ModelConfig
from fleetctl.engine.model.weights import LayerWeights, ModelWeights
from fleetctl.errors import UserError


def weight_files(model_dir: Path) -> list[Path]:
    single = model_dir / "model.safetensors"
    if single.exists():
        return [single]
    index = model_dir / "model.safetensors.index.json"
    if index.exists():
        names = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        return [model_dir / name for name in names]
    raise UserError(f"{model_dir}: no model.safetensors (or model.safetensors.index.json)")


class _TensorSource:
    """Looks tensors up by name across (possibly sharded) safetensors files, memory-mapped."""

    def __init__(self, files: list[Path]) -> None:
        self._handles = [safe_open(str(f), framework="pt") for f in files]
        self._where = {name: h for h in self._handles for name in h.keys()}  # noqa: SIM118

    def __contains__(self, name: str) -> bool:
        return name in self._where

    def get(self, name: str, shape: tuple[int, ...]) -> torch.Tensor:
        if name not in self._where:
            raise UserError(f"weights: tensor {name} is missing")
        tensor = self._where[name].get_tensor(name)
        if tuple(tensor.shape) != shape:
            raise UserError(f"weights: {name} has shape {tuple(tensor.shape)}, expected {shape}")
        return tensor


def load_weights(
    model_dir: Path, config: ModelConfig, dtype: torch.dtype, device: torch.device
) -> ModelWeights:
    """The checkpoint's tensors in the engine's layout: fused as the family names them (families/), in `dtype`
    on `device`; a family's norm offset folded into its norm weights in float32 first (Gemma's 1 + w)."""
    source = _TensorSource(weight_files(model_dir))
    family = family_named(config.family)
    traits = config.traits
    shapes = Shapes(config.hidden_size, config.intermediate_size, config.num_heads * config.head_dim,
                    config.num_kv_heads * config.head_dim, config.head_dim)

    def fetch(specs: list[TensorSpec], norm: bool = False) -> torch.Tensor:
        tensors = [source.get(name, shape) for name, shape in specs]
        tensor = tensors[0] if len(tensors) == 1 else torch.cat(tensors)
        if norm and traits.norm_offset:
            tensor = tensor.float() + traits.norm_offset
        return tensor.to(device=device, dtype=dtype)

    layers = []
    for i in range(config.num_layers):
        named = family.layer_tensors(i, shapes, traits, config.attention_bias)
        layers.append(LayerWeights(**{field: fetch(specs, norm=field in NORM_FIELDS) for field, specs in named.items()},
                                   **{field: None for field in _OPTIONAL_FIELDS if field not in named}))
    d_model = config.hidden_size
    embed = fetch([("model.embed_tokens.weight", (config.vocab_size, d_model))])
    tied = config.tie_word_embeddings or "lm_head.weight" not in source
    lm_head = embed if tied else fetch([("lm_head.weight", (config.vocab_size, d_model))])
    final_norm = fetch([("model.norm.weight", (d_model,))], norm=True)
    return ModelWeights(embed=embed, layers=layers, final_norm=final_norm, lm_head=lm_head)


_OPTIONAL_FIELDS = ("qkv_bias", "q_norm", "k_norm", "attn_out_norm", "mlp_out_norm")
