"""The hyper-parameters a llama.cpp GGUF stores under `<arch>.*`, and the config.json transformers expects for
that architecture (`llama`, `qwen2`, `qwen3`, `gemma3`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import gguf
import numpy as np

from fleetctl.errors import UserError

SUPPORTED_ARCHITECTURES = ("llama", "qwen2", "qwen3", "gemma3")
_REQUIRED = object()


class GGUFConvertError(UserError):
    """The GGUF cannot be turned into a Hugging Face model directory."""


def field(reader: gguf.GGUFReader, key: str, default: Any = _REQUIRED) -> Any:
    """The contents of metadata `key`; `default` (else an error) when the GGUF lacks it."""
    found = reader.fields.get(key)
    if found is None:
        if default is _REQUIRED:
            raise GGUFConvertError(f"GGUF has no metadata key {key!r}")
        return default
    return found.contents()


@dataclass(frozen=True)
class GGUFParams:
    """The model shape a GGUF stores under `<arch>.*`."""

    arch: str
    layers: int
    hidden: int
    ffn: int
    heads: int
    kv_heads: int
    head_dim: int
    context: int
    rope_theta: float
    rms_eps: float
    vocab: int
    sliding_window: int | None
    rope_scaling: dict[str, Any] | None


def _embedding_rows(reader: gguf.GGUFReader) -> int:
    for tensor in reader.tensors:
        if tensor.name == "token_embd.weight":
            return int(tensor.shape[-1])  # GGUF dims run innermost first: [hidden, vocab]
    raise GGUFConvertError("GGUF has no token_embd.weight tensor")


def _float32(value: float) -> float:
    """A float32 metadata value through numpy's shortest repr, so config.json says 1e-05."""
    return float(str(np.float32(value)))


def _rope_scaling(reader: gguf.GGUFReader, arch: str) -> dict[str, Any] | None:
    kind = field(reader, f"{arch}.rope.scaling.type", "none")
    if kind in ("none", None):
        return None
    factor = _float32(field(reader, f"{arch}.rope.scaling.factor"))
    if kind == "linear":
        return {"rope_type": "linear", "factor": factor}
    if kind == "yarn":
        return {"rope_type": "yarn", "factor": factor, "original_max_position_embeddings":
                int(field(reader, f"{arch}.rope.scaling.original_context_length"))}
    raise GGUFConvertError(f"GGUF rope scaling {kind!r} is not supported")


def read_params(reader: gguf.GGUFReader) -> GGUFParams:
    """The model shape, refusing an architecture transformers' families here do not cover."""
    arch = field(reader, "general.architecture")
    if arch not in SUPPORTED_ARCHITECTURES:
        raise GGUFConvertError(f"GGUF architecture is {arch!r}; supported: {', '.join(SUPPORTED_ARCHITECTURES)}")
    hidden, heads = field(reader, f"{arch}.embedding_length"), field(reader, f"{arch}.attention.head_count")
    head_dim = int(field(reader, f"{arch}.attention.key_length", hidden // heads))
    if field(reader, f"{arch}.rope.dimension_count", head_dim) != head_dim:
        raise GGUFConvertError("GGUF uses partial rotary embeddings, which this architecture does not support")
    window = field(reader, f"{arch}.attention.sliding_window", None)
    return GGUFParams(
        arch=arch,
        layers=field(reader, f"{arch}.block_count"),
        hidden=hidden,
        ffn=field(reader, f"{arch}.feed_forward_length"),
        heads=heads,
        kv_heads=field(reader, f"{arch}.attention.head_count_kv", heads),
        head_dim=head_dim,
        context=field(reader, f"{arch}.context_length"),
        rope_theta=_float32(field(reader, f"{arch}.rope.freq_base", 10000.0)),
        rms_eps=_float32(field(reader, f"{arch}.attention.layer_norm_rms_epsilon")),
        vocab=_embedding_rows(reader),
        sliding_window=None if window is None else int(window),
        rope_scaling=_rope_scaling(reader, arch),
    )


_GEMMA3_SLIDING_PATTERN = 6  # every 6th layer global, the others sliding-window
_IDENTITY = {
    "llama": ("LlamaForCausalLM", "llama"),
    "qwen2": ("Qwen2ForCausalLM", "qwen2"),
    "qwen3": ("Qwen3ForCausalLM", "qwen3"),
    "gemma3": ("Gemma3ForCausalLM", "gemma3_text"),
}


def build_config(params: GGUFParams, special_ids: dict[str, int], tied: bool) -> dict[str, Any]:
    """config.json for `params.arch`."""
    architecture, model_type = _IDENTITY[params.arch]
    config: dict[str, Any] = {
        "architectures": [architecture],
        "model_type": model_type,
        "vocab_size": params.vocab,
        "hidden_size": params.hidden,
        "intermediate_size": params.ffn,
        "num_hidden_layers": params.layers,
        "num_attention_heads": params.heads,
        "num_key_value_heads": params.kv_heads,
        "head_dim": params.head_dim,
        "hidden_act": "silu",
        "max_position_embeddings": params.context,
        "rms_norm_eps": params.rms_eps,
        "rope_theta": params.rope_theta,
        "rope_scaling": params.rope_scaling,
        "attention_bias": params.arch == "qwen2",
        "tie_word_embeddings": tied,
        "torch_dtype": "float32",
        "use_cache": True,
        **{f"{role}_token_id": special_ids[role] for role in ("bos", "eos", "pad") if role in special_ids},
    }
    if params.arch == "llama":
        config["mlp_bias"] = False
    if params.arch == "gemma3":
        del config["hidden_act"]
        config.update({
            "hidden_activation": "gelu_pytorch_tanh",
            "sliding_window": params.sliding_window or 512,
            "layer_types": ["full_attention" if (i + 1) % _GEMMA3_SLIDING_PATTERN == 0 else "sliding_attention"
                            for i in range(params.layers)],
            "rope_local_base_freq": 10000.0,
            "query_pre_attn_scalar": params.head_dim,
            "final_logit_softcapping": None,
            "attn_logit_softcapping": None,
        })
    return config
