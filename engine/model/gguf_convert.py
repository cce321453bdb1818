"""Convert a llama.cpp GGUF (architecture `llama`) into a Hugging Face Llama directory.

Weights are dequantized to float32 and renamed to transformers' names; the tokenizer, chat
template and special tokens are rebuilt from the GGUF metadata.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import gguf
import numpy as np
from safetensors.numpy import save_file
from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, processors

Progress = Callable[[str, int, int], None]

_LAYER_TENSORS = {
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
}
_GLOBAL_TENSORS = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
_LAYER_NAME = re.compile(r"blk\.(\d+)\.(\w+)\.weight")
_TOKEN_TYPE_CONTROL = 3
# The `tokenizer.ggml.pre` names (among Llama-architecture GGUFs) that llama.cpp splits as "each digit
# alone, then GPT-2's regex".
_DIGIT_SPLIT_PRE_TYPES = {"smollm"}
_REQUIRED = object()


class GGUFConvertError(ValueError):
    """The GGUF cannot be turned into a Hugging Face Llama directory."""


@dataclass(frozen=True)
class LlamaParams:
    """The hyper-parameters a GGUF stores under `llama.*`."""

    layers: int
    hidden: int
    ffn: int
    heads: int
    kv_heads: int
    context: int
    rope_theta: float
    rms_eps: float
    vocab: int


def _field(reader: gguf.GGUFReader, key: str, default: Any = _REQUIRED) -> Any:
    field = reader.fields.get(key)
    if field is None:
        if default is _REQUIRED:
            raise GGUFConvertError(f"GGUF has no metadata key {key!r}")
        return default
    return field.contents()


def _embedding_rows(reader: gguf.GGUFReader) -> int:
    for tensor in reader.tensors:
        if tensor.name == "token_embd.weight":
            return int(tensor.shape[-1])  # GGUF dims run innermost first: [hidden, vocab]
    raise GGUFConvertError("GGUF has no token_embd.weight tensor")


def read_params(reader: gguf.GGUFReader) -> LlamaParams:
    """The model shape, checking this is a plain Llama that transformers can run."""
    arch = _field(reader, "general.architecture")
    if arch != "llama":
        raise GGUFConvertError(f"GGUF architecture is {arch!r}; only 'llama' is supported")
    params = LlamaParams(
        layers=_field(reader, "llama.block_count"),
        hidden=_field(reader, "llama.embedding_length"),
        ffn=_field(reader, "llama.feed_forward_length"),
        heads=_field(reader, "llama.attention.head_count"),
        kv_heads=_field(reader, "llama.attention.head_count_kv"),
        context=_field(reader, "llama.context_length"),
        rope_theta=_field(reader, "llama.rope.freq_base", 10000.0),
        # Stored as float32: go through numpy's shortest repr so config.json says 1e-05.
        rms_eps=float(str(np.float32(_field(reader, "llama.attention.layer_norm_rms_epsilon")))),
        vocab=_embedding_rows(reader),
    )
    head_dim = params.hidden // params.heads
    if _field(reader, "llama.rope.dimension_count", head_dim) != head_dim:
        raise GGUFConvertError("GGUF uses partial rotary embeddings, which Llama does not support")
    return params


def unpermute_rotary(weight: np.ndarray, heads: int) -> np.ndarray:
    """Undo llama.cpp's row order for a Q or K projection.

    Per head, HF keeps the two rotary halves as blocks (row `j * half + i` for half j); llama.cpp
    stores them as interleaved pairs (row `2 * i + j`). Viewing the rows as [head, i, j] and
    swapping to [head, j, i] restores HF's order.
    """
    rows = weight.shape[0]
    half = rows // heads // 2
    pairs = weight.reshape(heads, half, 2, *weight.shape[1:])
    return np.ascontiguousarray(pairs.swapaxes(1, 2).reshape(weight.shape))


def _hf_name(gguf_name: str) -> tuple[str, str]:
    """(transformers name, GGUF kind) for a GGUF tensor name."""
    if gguf_name in _GLOBAL_TENSORS:
        return _GLOBAL_TENSORS[gguf_name], gguf_name
    match = _LAYER_NAME.fullmatch(gguf_name)
    if match is None or match.group(2) not in _LAYER_TENSORS:
        raise GGUFConvertError(f"GGUF tensor {gguf_name!r} has no Llama counterpart")
    layer, kind = match.groups()
    return f"model.layers.{layer}.{_LAYER_TENSORS[kind]}.weight", kind


def read_weights(
    reader: gguf.GGUFReader, params: LlamaParams, progress: Progress | None = None
) -> dict[str, np.ndarray]:
    """All tensors as float32 numpy arrays under transformers' names, in torch's row-major shape."""
    weights: dict[str, np.ndarray] = {}
    total = len(reader.tensors)
    for done, tensor in enumerate(reader.tensors, start=1):
        name, kind = _hf_name(tensor.name)
        # GGUF lists dims innermost first; dequantize already yields torch's order.
        data = gguf.quants.dequantize(tensor.data, tensor.tensor_type).astype(np.float32, copy=False)
        expected = tuple(int(d) for d in reversed(tensor.shape))
        if data.shape != expected:
            raise GGUFConvertError(f"tensor {tensor.name}: dequantized to {data.shape}, expected {expected}")
        if kind == "attn_q":
            data = unpermute_rotary(data, params.heads)
        elif kind == "attn_k":
            data = unpermute_rotary(data, params.kv_heads)
        weights[name] = np.ascontiguousarray(data)
        if progress is not None:
            progress("convert", done, total)
    return weights


def build_tokenizer(reader: gguf.GGUFReader) -> Tokenizer:
    """A byte-level BPE `tokenizers.Tokenizer` equivalent to the GGUF's `gpt2` tokenizer."""
    model = _field(reader, "tokenizer.ggml.model")
    if model != "gpt2":
        raise GGUFConvertError(f"GGUF tokenizer is {model!r}; only byte-level BPE ('gpt2') is supported")
    tokens: list[str] = _field(reader, "tokenizer.ggml.tokens")
    merges = [tuple(merge.split(" ")) for merge in _field(reader, "tokenizer.ggml.merges")]
    if any(len(merge) != 2 for merge in merges):
        raise GGUFConvertError("GGUF merges are not all 'left right' pairs")
    vocab = {token: index for index, token in enumerate(tokens)}
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=merges, fuse_unk=False, byte_fallback=False))

    pre_type = _field(reader, "tokenizer.ggml.pre", "default")
    if pre_type not in _DIGIT_SPLIT_PRE_TYPES:
        raise GGUFConvertError(f"GGUF pre-tokenizer {pre_type!r} is not supported")
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
        ]
    )
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.post_processor = processors.ByteLevel(trim_offsets=False)

    token_types = _field(reader, "tokenizer.ggml.token_type")
    tokenizer.add_special_tokens(
        [
            AddedToken(token, special=True, normalized=False)
            for token, token_type in zip(tokens, token_types, strict=True)
            if token_type == _TOKEN_TYPE_CONTROL
        ]
    )
    return tokenizer


def _special_ids(reader: gguf.GGUFReader) -> dict[str, int]:
    """{"bos": 1, ...}: the special token ids the GGUF names."""
    keys = {"bos": "bos_token_id", "eos": "eos_token_id", "unk": "unknown_token_id", "pad": "padding_token_id"}
    return {
        role: int(_field(reader, f"tokenizer.ggml.{key}"))
        for role, key in keys.items()
        if f"tokenizer.ggml.{key}" in reader.fields
    }


def _config(params: LlamaParams, special_ids: dict[str, int], tied: bool) -> dict[str, Any]:
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": params.vocab,
        "hidden_size": params.hidden,
        "intermediate_size": params.ffn,
        "num_hidden_layers": params.layers,
        "num_attention_heads": params.heads,
        "num_key_value_heads": params.kv_heads,
        "head_dim": params.hidden // params.heads,
        "hidden_act": "silu",
        "max_position_embeddings": params.context,
        "rms_norm_eps": params.rms_eps,
        "rope_theta": params.rope_theta,
        "rope_scaling": None,
        "attention_bias": False,
        "mlp_bias": False,
        "tie_word_embeddings": tied,
        "torch_dtype": "float32",
        "use_cache": True,
        **{f"{role}_token_id": special_ids[role] for role in ("bos", "eos", "pad") if role in special_ids},
    }


def _write_json(path: Path, data: dict[str, Any]) -> None:
    path.write_text(json.dumps(data, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


def convert_gguf(gguf_path: Path, out_dir: Path, progress: Progress | None = None) -> None:
    """Write config, float32 safetensors weights and tokenizer files for `gguf_path` into `out_dir`."""
    reader = gguf.GGUFReader(gguf_path)
    params = read_params(reader)
    tokenizer = build_tokenizer(reader)
    weights = read_weights(reader, params, progress)
    special_ids = _special_ids(reader)
    config = _config(params, special_ids, tied="lm_head.weight" not in weights)

    out_dir.mkdir(parents=True, exist_ok=True)
    save_file(weights, str(out_dir / "model.safetensors"), metadata={"format": "pt"})
    (out_dir / "model.safetensors").chmod(0o644)  # safetensors writes it owner-only
    tokenizer.save(str(out_dir / "tokenizer.json"))
    tokens = _field(reader, "tokenizer.ggml.tokens")
    special = {f"{role}_token": tokens[token_id] for role, token_id in special_ids.items()}
    tokenizer_config: dict[str, Any] = {
        # Not "GPT2Tokenizer": transformers 5 rebuilds that class's pre-tokenizer and drops the digit
        # split, which changes ids for text like " ½". This class uses tokenizer.json as written.
        "tokenizer_class": "PreTrainedTokenizerFast",
        "add_bos_token": bool(_field(reader, "tokenizer.ggml.add_bos_token", False)),
        "add_prefix_space": False,
        "clean_up_tokenization_spaces": False,
        "model_max_length": params.context,
        **special,
    }
    if "tokenizer.chat_template" in reader.fields:
        tokenizer_config["chat_template"] = _field(reader, "tokenizer.chat_template")
    _write_json(out_dir / "tokenizer_config.json", tokenizer_config)
    _write_json(out_dir / "special_tokens_map.json", special)
    _write_json(out_dir / "config.json", config)
    generation = {key: config[key] for key in ("bos_token_id", "eos_token_id", "pad_token_id") if key in config}
    _write_json(out_dir / "generation_config.json", generation)
