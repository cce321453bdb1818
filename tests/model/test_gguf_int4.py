"""A GGUF's 4-bit blocks served as they ship: the tiny model written as a Q4_0/Q4_1 GGUF (quantized by the `gguf`
package), imported into a model store (which keeps the GGUF), and loaded at int4 from those blocks. The blocks
read back are `gguf`'s own dequantization exactly; at float32 the engine's layer matrices are the dense weights
the store converted, bit for bit, and its greedy tokens those of the dense model."""

from pathlib import Path

import gguf
import numpy as np
import pytest
import torch

from fleetctl.domain import Quantization
from fleetctl.engine.core.engine_settings import EngineConfig, EngineSettings
from fleetctl.engine.core.llm_engine import LLMEngine
from fleetctl.engine.core.sequence import SamplingParams
from fleetctl.engine.model.gguf_blocks import read_int4_blocks
from fleetctl.engine.model.gguf_convert import unpermute_rotary
from fleetctl.engine.model.loader import load_weights
from fleetctl.engine.model.model_config import ModelConfig
from fleetctl.engine.model.model_store import SOURCE_GGUF, ModelStore
from fleetctl.engine.model.prepared import cache_path
from fleetctl.engine.model.quantize import MATRICES, resolve_quantization, weight_source
from fleetctl.kernels.quantized_linear import QuantizedWeight
from fleetctl.tests.support.tiny_wheel import write_tiny_gguf

BLOCK_TYPES = [gguf.GGMLQuantizationType.Q4_0, gguf.GGMLQuantizationType.Q4_1]
PROMPTS = ["The quick brown fox", "Once upon a time", "def add(a, b):"]


@pytest.fixture(scope="module", params=BLOCK_TYPES, ids=lambda t: t.name)
def q4_model(request: pytest.FixtureRequest, tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny model pulled from a GGUF whose layer matrices are `request.param` blocks."""
    root = tmp_path_factory.mktemp("q4-store")
    path = write_tiny_gguf(tiny_model_dir, root / "tiny.gguf", request.param)
    return ModelStore(root / "models").import_gguf(f"tiny-{request.param.name.lower()}", path, "test")


def test_the_blocks_read_back_are_the_gguf_packages_dequantization_exactly(q4_model: Path) -> None:
    config = ModelConfig.from_file(q4_model / "config.json")
    heads = {"attn_q": config.num_heads, "attn_k": config.num_kv_heads}
    matrices = [t for t in gguf.GGUFReader(q4_model / SOURCE_GGUF).tensors if t.tensor_type.name.startswith("Q4")]
    assert len(matrices) == 7 * config.num_layers
    for tensor in matrices:
        kind = tensor.name.split(".")[2]
        reference = gguf.quants.dequantize(tensor.data, tensor.tensor_type).astype(np.float32)
        if kind in heads:
            reference = unpermute_rotary(reference, heads[kind])
        assert np.array_equal(read_int4_blocks(tensor, heads.get(kind)).dequantize().numpy(), reference), tensor.name


def test_auto_is_int4_from_the_kept_gguf_and_dense_without_one(q4_model: Path, tiny_model_dir: Path) -> None:
    assert (q4_model / SOURCE_GGUF).is_file()
    assert resolve_quantization(Quantization.AUTO, q4_model) is Quantization.INT4
    assert weight_source(Quantization.INT4, 32, q4_model) == "int4-gguf"
    assert weight_source(Quantization.INT4, 64, q4_model) == "int4-g64"  # other groups: round-to-nearest
    assert resolve_quantization(Quantization.AUTO, tiny_model_dir) is Quantization.NONE
    assert weight_source(Quantization.INT4, 32, tiny_model_dir) == "int4-g32"


def test_int4_from_the_gguf_serves_the_shipped_weights_bit_for_bit(q4_model: Path) -> None:
    def engine(quantization: Quantization) -> LLMEngine:
        settings = EngineSettings(dtype="float32", quantization=quantization, num_kv_blocks=64)
        return LLMEngine(EngineConfig(q4_model, settings=settings))

    int4, dense = engine(Quantization.AUTO), engine(Quantization.NONE)
    assert int4.weight_format == "int4-gguf" and int4.weights_label == "int4-gguf"
    assert dense.weights_label == "float32"
    assert cache_path(q4_model, torch.float32, "int4-gguf").is_file()  # the prepared layout, mapped next time
    converted = load_weights(q4_model, int4.model_config, torch.float32, torch.device("cpu"))
    for layer, reference in zip(int4.model.weights.layers, converted.layers, strict=True):
        for name in MATRICES:
            assert torch.equal(getattr(layer, name).dequantize(), getattr(reference, name)), name
    params = SamplingParams(max_tokens=16, temperature=0.0, ignore_eos=True)
    outputs = [[r.token_ids for r in e.generate(PROMPTS, params)] for e in (int4, dense)]
    assert outputs[0] == outputs[1]
    assert int4.model.weights.layer_matrix_bytes < dense.model.weights.layer_matrix_bytes / 5


def test_a_q8_0_head_is_served_as_its_blocks(tiny_model_dir: Path, tmp_path: Path) -> None:
    """A GGUF that ships its head in Q8_0 (as llama.cpp's files do): the engine multiplies by those blocks (int8 with
    a scale per 32 inputs, half a bf16 head's bytes), kept in the prepared cache; its logits are the dense head's to
    float32 rounding."""
    path = write_tiny_gguf(tiny_model_dir, tmp_path / "tiny.gguf", gguf.GGMLQuantizationType.Q4_0,
                           {"output.weight": gguf.GGMLQuantizationType.Q8_0})
    model_dir = ModelStore(tmp_path / "models").import_gguf("tiny-q8-head", path, "test")
    settings = EngineSettings(dtype="float32", quantization=Quantization.INT4, num_kv_blocks=64)
    engines = [LLMEngine(EngineConfig(model_dir, settings=settings)) for _ in range(2)]  # built, then mapped
    head = engines[1].model.weights.lm_head
    assert isinstance(head, QuantizedWeight) and head.blockwise and head.data.dtype == torch.int8
    shipped = next(t for t in gguf.GGUFReader(model_dir / SOURCE_GGUF).tensors if t.name == "output.weight")
    reference = gguf.quants.dequantize(shipped.data, shipped.tensor_type).astype(np.float32)
    assert np.array_equal(head.dequantize().numpy(), reference)
    weights = head.out_features * head.in_features
    assert engines[1].model.weights.head_bytes == weights + weights // 32 * 4  # the codes, a float32 scale per 32
    hidden = torch.randn(3, head.in_features, generator=torch.Generator().manual_seed(0))
    torch.testing.assert_close(engines[1].model.logits(hidden), hidden @ torch.from_numpy(reference).T,
                               rtol=1e-5, atol=1e-4)
