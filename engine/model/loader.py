"""Load a Hugging Face Llama-family directory into LlamaWeights (memory-mapped safetensors; no
transformers import)."""

import json
from pathlib import Path

import torch
from safetensors import safe_open

from fleetctl.engine.model.config import ModelConfig
from fleetctl.engine.model.llama import LayerWeights, LlamaWeights
from fleetctl.engine.model.weight_errors import WeightLoadError


def weight_files(model_dir: Path) -> list[Path]:
    single = model_dir / "model.safetensors"
    if single.exists():
        return [single]
    index = model_dir / "model.safetensors.index.json"
    if index.exists():
        names = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        return [model_dir / name for name in names]
    raise WeightLoadError(f"{model_dir}: no model.safetensors (or model.safetensors.index.json)")


class _TensorSource:
    """Looks tensors up by name across (possibly sharded) safetensors files, memory-mapped."""

    def __init__(self, files: list[Path]) -> None:
        self._handles = [safe_open(str(f), framework="pt") for f in files]
        self._where = {name: h for h in self._handles for name in h.keys()}  # noqa: SIM118

    def __contains__(self, name: str) -> bool:
        return name in self._where

    def get(self, name: str, shape: tuple[int, ...]) -> torch.Tensor:
        if name not in self._where:
            raise WeightLoadError(f"weights: tensor {name} is missing")
        tensor = self._where[name].get_tensor(name)
        if tuple(tensor.shape) != shape:
            raise WeightLoadError(f"weights: {name} has shape {tuple(tensor.shape)}, expected {shape}")
        return tensor


def load_weights(
    model_dir: Path, config: ModelConfig, dtype: torch.dtype, device: torch.device
) -> LlamaWeights:
    source = _TensorSource(weight_files(model_dir))
    d_model, head = config.hidden_size, config.head_dim
    q_rows, kv_rows = config.num_heads * head, config.num_kv_heads * head

    def fetch(name: str, *shape: int) -> torch.Tensor:
        return source.get(name, shape).to(device=device, dtype=dtype)

    def fused(names: list[str], shapes: list[tuple[int, ...]]) -> torch.Tensor:
        return torch.cat([source.get(n, s) for n, s in zip(names, shapes, strict=True)]).to(
            device=device, dtype=dtype
        )

    layers = []
    for i in range(config.num_layers):
        p = f"model.layers.{i}."
        attn, mlp = p + "self_attn.", p + "mlp."
        bias = None
        if config.attention_bias:
            bias = fused([attn + f"{n}_proj.bias" for n in "qkv"], [(q_rows,), (kv_rows,), (kv_rows,)])
        layers.append(
            LayerWeights(
                input_norm=fetch(p + "input_layernorm.weight", d_model),
                qkv=fused(
                    [attn + f"{n}_proj.weight" for n in "qkv"],
                    [(q_rows, d_model), (kv_rows, d_model), (kv_rows, d_model)],
                ),
                qkv_bias=bias,
                o_proj=fetch(attn + "o_proj.weight", d_model, q_rows),
                post_norm=fetch(p + "post_attention_layernorm.weight", d_model),
                gate_up=fused(
                    [mlp + "gate_proj.weight", mlp + "up_proj.weight"],
                    [(config.intermediate_size, d_model)] * 2,
                ),
                down=fetch(mlp + "down_proj.weight", d_model, config.intermediate_size),
            )
        )
    embed = fetch("model.embed_tokens.weight", config.vocab_size, d_model)
    tied = config.tie_word_embeddings or "lm_head.weight" not in source
    lm_head = embed if tied else fetch("lm_head.weight", config.vocab_size, d_model)
    return LlamaWeights(
        embed=embed, layers=layers, final_norm=fetch("model.norm.weight", d_model), lm_head=lm_head
    )
