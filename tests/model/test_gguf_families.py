"""Tiny random Qwen2, Qwen3 and Gemma 3 models written as llama.cpp GGUFs (llama.cpp's own conventions: no rotary
permutation outside `llama`, Gemma's norms stored as w + 1), converted back: transformers loads the directory and
its logits are the original model's at float32. Written with quantized layer matrices and imported, int4 and
int8 serve the shipped blocks in Hugging Face's row order (the converted weights, bit for bit)."""

import json
from pathlib import Path

import gguf
import numpy as np
import pytest
import torch
import transformers
from safetensors.numpy import load_file

from fleetctl.domain import Quantization
from fleetctl.engine.core.engine_settings import EngineConfig, EngineSettings
from fleetctl.engine.core.llm_engine import LLMEngine
from fleetctl.engine.core.sequence import SamplingParams
from fleetctl.engine.model.gguf_convert import _ARCH_LAYER_TENSORS, _GLOBAL_TENSORS, _LAYER_TENSORS, convert_gguf
from fleetctl.engine.model.loader import load_weights
from fleetctl.engine.model.model_config import ModelConfig
from fleetctl.engine.model.model_store import ModelStore
from fleetctl.engine.model.quantize import MATRICES
from fleetctl.tests.support.family_models import _SHAPE
from fleetctl.tests.support.tiny_model import write_tokenizer
from fleetctl.tests.support.tiny_wheel import add_gpt2_tokenizer, add_shape

# arch: (model_type, config beyond _SHAPE that a GGUF can express)
FAMILIES = {
    "qwen2": ("qwen2", {"rope_theta": 1000000.0}),
    "qwen3": ("qwen3", {"rope_theta": 1000000.0}),
    "gemma3": ("gemma3_text", {"sliding_window": 24, "query_pre_attn_scalar": 16, "tie_word_embeddings": True,
                               "num_hidden_layers": 6, "rope_theta": 1000000.0, "rope_local_base_freq": 10000.0}),
}


def _gguf_name(hf_name: str, arch: str) -> str:
    for gguf_name, name in _GLOBAL_TENSORS.items():
        if name == hf_name:
            return gguf_name
    _, _, layer, module = hf_name.split(".", 3)
    module, suffix = module.rsplit(".", 1)
    renames = {**_LAYER_TENSORS, **_ARCH_LAYER_TENSORS[arch]}
    return f"blk.{layer}.{next(k for k, v in renames.items() if v == module)}.{suffix}"


def _write(arch: str, tmp: Path,
           matrix_types: dict[str, gguf.GGMLQuantizationType] | None = None) -> tuple[Path, Path]:
    """The family's tiny model as a Hugging Face directory and as a GGUF; `matrix_types` quantizes the layer
    matrices of those GGUF kinds (`attn_q`: Q4_0)."""
    model_type, fields = FAMILIES[arch]
    src = tmp / "hf"
    tok = write_tokenizer(src, max_length=_SHAPE["max_position_embeddings"])
    config = transformers.AutoConfig.for_model(model_type, vocab_size=tok.get_vocab_size(), **{**_SHAPE, **fields})
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    with torch.no_grad():
        for name, param in model.named_parameters():
            param.copy_(torch.randn(param.shape) * (0.1 if "norm" in name else 0.15) + (
                1.0 if "norm" in name and arch != "gemma3" else 0.0))
    model.save_pretrained(src)
    tokenizer = json.loads((src / "tokenizer.json").read_text())
    writer = gguf.GGUFWriter(tmp / "m.gguf", arch)
    c = config.to_dict()
    add_shape(writer, c)
    writer.add_key_length(c["head_dim"])
    writer.add_value_length(c["head_dim"])
    writer.add_rope_freq_base(1000000.0)
    if arch == "gemma3":
        writer.add_sliding_window(24)
    add_gpt2_tokenizer(writer, tokenizer, 1, 2)
    for hf_name, weight in load_file(src / "model.safetensors").items():
        if arch == "gemma3" and hf_name.endswith("norm.weight"):
            weight = weight + np.float32(1.0)  # llama.cpp's Gemma 3 converter
        name = _gguf_name(hf_name, arch)
        qtype = (matrix_types or {}).get(name.split(".")[2]) if name.startswith("blk.") else None
        if qtype is None:
            writer.add_tensor(name, weight)
        else:
            writer.add_tensor(name, gguf.quants.quantize(weight, qtype), raw_dtype=qtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return src, tmp / "m.gguf"


@pytest.mark.parametrize("arch", list(FAMILIES))
def test_converted_gguf_has_the_original_logits(arch: str, tmp_path: Path) -> None:
    src, path = _write(arch, tmp_path)
    convert_gguf(path, tmp_path / "out")
    ids = torch.tensor([list(range(3, 43))])
    logits = [transformers.AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32, attn_implementation="eager")
              .eval()(ids).logits for d in (src, tmp_path / "out")]
    torch.testing.assert_close(logits[1], logits[0], atol=1e-5, rtol=1e-5)
    settings = EngineSettings(dtype="float32", quantization=Quantization.NONE, num_kv_blocks=16,
                              max_num_batched_tokens=256, prefix_cache=False)
    [ours] = LLMEngine(EngineConfig(tmp_path / "out", settings=settings)).generate(
        [ids[0].tolist()], SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True))
    reference = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "out", dtype=torch.float32,
                                                                  attn_implementation="eager").eval()
    theirs = reference.generate(ids, max_new_tokens=8, min_new_tokens=8, do_sample=False)[0, ids.shape[1]:]
    assert ours.token_ids == theirs.tolist()


Q4_0, Q8_0 = gguf.GGMLQuantizationType.Q4_0, gguf.GGMLQuantizationType.Q8_0
# Q and K in 4 bits (the rows llama.cpp permutes for `llama` only), every other layer matrix in 8
QUANTIZED = {"attn_q": Q4_0, "attn_k": Q4_0, "attn_v": Q8_0, "attn_output": Q8_0, "ffn_gate": Q8_0, "ffn_up": Q8_0,
             "ffn_down": Q8_0}


@pytest.mark.parametrize("arch", list(FAMILIES))
def test_quantized_layers_serve_the_shipped_blocks_in_hugging_faces_row_order(arch: str, tmp_path: Path) -> None:
    _, path = _write(arch, tmp_path, QUANTIZED)
    model_dir = ModelStore(tmp_path / "models").import_gguf(f"tiny-{arch}", path, "test")
    config = ModelConfig.from_file(model_dir / "config.json")
    converted = load_weights(model_dir, config, torch.float32, torch.device("cpu"))
    qk_rows = (config.num_heads + config.num_kv_heads) * config.head_dim
    for quantization, label in ((Quantization.INT4, "int4-gguf-mixed"), (Quantization.INT8, "int8-gguf")):
        settings = EngineSettings(dtype="float32", quantization=quantization, num_kv_blocks=16)
        engine = LLMEngine(EngineConfig(model_dir, settings=settings))
        assert engine.weight_format == label
        for layer, reference in zip(engine.model.weights.layers, converted.layers, strict=True):
            if quantization is Quantization.INT4:  # Q and K as shipped, the rest rounded from the 8-bit weights
                assert torch.equal(layer.qkv.dequantize()[:qk_rows], reference.qkv[:qk_rows])
            else:
                for name in MATRICES:
                    assert torch.equal(getattr(layer, name).dequantize(), getattr(reference, name)), name
