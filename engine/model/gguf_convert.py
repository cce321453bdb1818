"""Convert a llama.cpp GGUF (architecture `llama`, `qwen2`, `qwen3` or `gemma3`) into a Hugging Face directory.

Weights are dequantized to float32 and renamed to transformers' names; the tokenizer, chat
template and special tokens are rebuilt from the GGUF metadata. Hyper-parameters and config.json are
gguf_params.py's.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import gguf
import numpy as np
from safetensors.numpy import save_file

from fleetctl.engine.model.gguf_params import GGUFConvertError, GGUFParams, build_config, field, read_params
from fleetctl.engine.model.gguf_tokenizer import build_tokenizer

__all__ = ["GGUFConvertError", "Progress", "build_tokenizer", "convert_gguf", "unpermute_rotary"]

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
# per architecture, GGUF layer tensor kinds beyond the Llama ones (or renamed)
_ARCH_LAYER_TENSORS = {
    "llama": {},
    "qwen2": {},
    "qwen3": {"attn_q_norm": "self_attn.q_norm", "attn_k_norm": "self_attn.k_norm"},
    "gemma3": {"attn_q_norm": "self_attn.q_norm", "attn_k_norm": "self_attn.k_norm",
               "post_attention_norm": "post_attention_layernorm", "ffn_norm": "pre_feedforward_layernorm",
               "post_ffw_norm": "post_feedforward_layernorm"},
}
_LAYER_NAME = re.compile(r"blk\.(\d+)\.(\w+)\.(weight|bias)")

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


def _hf_name(gguf_name: str, arch: str) -> tuple[str, str]:
    """(transformers name, GGUF kind) for a GGUF tensor name of architecture `arch`."""
    if gguf_name in _GLOBAL_TENSORS:
        return _GLOBAL_TENSORS[gguf_name], gguf_name
    match = _LAYER_NAME.fullmatch(gguf_name)
    renames = {**_LAYER_TENSORS, **_ARCH_LAYER_TENSORS[arch]}
    if match is None or match.group(2) not in renames:
        raise GGUFConvertError(f"GGUF tensor {gguf_name!r} has no {arch} counterpart")
    layer, kind, suffix = match.groups()
    return f"model.layers.{layer}.{renames[kind]}.{suffix}", kind


def read_weights(
    reader: gguf.GGUFReader, params: GGUFParams, progress: Progress | None = None
) -> dict[str, np.ndarray]:
    """All tensors as float32 numpy arrays under transformers' names, in torch's row-major shape.

    llama.cpp permutes the Q/K rows for RoPE only for `llama`; its Gemma 3 converter stores every RMSNorm weight
    as w + 1 (Gemma's norm scales by 1 + w), so 1 comes off again here.
    """
    weights: dict[str, np.ndarray] = {}
    total = len(reader.tensors)
    for done, tensor in enumerate(reader.tensors, start=1):
        name, kind = _hf_name(tensor.name, params.arch)
        # GGUF lists dims innermost first; dequantize already yields torch's order.
        data = gguf.quants.dequantize(tensor.data, tensor.tensor_type).astype(np.float32, copy=False)
        expected = tuple(int(d) for d in reversed(tensor.shape))
        if data.shape != expected:
            raise GGUFConvertError(f"tensor {tensor.name}: dequantized to {data.shape}, expected {expected}")
        if params.arch == "llama" and kind == "attn_q":
            data = unpermute_rotary(data, params.heads)
        elif params.arch == "llama" and kind == "attn_k":
            data = unpermute_rotary(data, params.kv_heads)
        elif params.arch == "gemma3" and tensor.name.endswith("norm.weight"):
            data = data - np.float32(1.0)
        weights[name] = np.ascontiguousarray(data)
        if progress is not None:
            progress("convert", done, total)
    return weights


def _special_ids(reader: gguf.GGUFReader) -> dict[str, int]:
    """{"bos": 1, ...}: the special token ids the GGUF names."""
    keys = {"bos": "bos_token_id", "eos": "eos_token_id", "unk": "unknown_token_id", "pad": "padding_token_id"}
    return {
        role: int(field(reader, f"tokenizer.ggml.{key}"))
        for role, key in keys.items()
        if f"tokenizer.ggml.{key}" in reader.fields
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
    config = build_config(params, special_ids, tied="lm_head.weight" not in weights)

    out_dir.mkdir(parents=True, exist_ok=True)
    save_file(weights, str(out_dir / "model.safetensors"), metadata={"format": "pt"})
    (out_dir / "model.safetensors").chmod(0o644)  # safetensors writes it owner-only
    tokenizer.save(str(out_dir / "tokenizer.json"))
    tokens = field(reader, "tokenizer.ggml.tokens")
    special = {f"{role}_token": tokens[token_id] for role, token_id in special_ids.items()}
    tokenizer_config: dict[str, Any] = {
        # Not "GPT2Tokenizer": transformers 5 rebuilds that class's pre-tokenizer and drops the digit
        # split, which changes ids for text like " ½". This class uses tokenizer.json as written.
        "tokenizer_class": "PreTrainedTokenizerFast",
        "add_bos_token": bool(field(reader, "tokenizer.ggml.add_bos_token", False)),
        "add_prefix_space": False,
        "clean_up_tokenization_spaces": False,
        "model_max_length": params.context,
        **special,
    }
    if "tokenizer.chat_template" in reader.fields:
        tokenizer_config["chat_template"] = field(reader, "tokenizer.chat_template")
    _write_json(out_dir / "tokenizer_config.json", tokenizer_config)
    _write_json(out_dir / "special_tokens_map.json", special)
    _write_json(out_dir / "config.json", config)
    generation = {key: config[key] for key in ("bos_token_id", "eos_token_id", "pad_token_id") if key in config}
    _write_json(out_dir / "generation_config.json", generation)
