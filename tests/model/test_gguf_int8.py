"""A GGUF's 8- and 5-bit blocks served as they ship (int8-split): random Q8_0, Q5_0 and Q5_1 blocks read back are
the `gguf` package's own dequantization exactly, and so is their int8-split layout; the tiny model written as a
Q8_0 GGUF (and as one mixing Q8_0 with Q5_0, Q5_1, Q4_1 and an F16 part), imported into a model store and loaded
at int8, holds every shipped block bit for bit at float32 and decodes the dense model's greedy tokens; an F16 part
is rounded to nearest in groups of 32. A GGUF of 4-bit blocks only keeps int8 per channel."""

from pathlib import Path

import gguf
import numpy as np
import pytest
import torch

from fleetctl.domain import Quantization
from fleetctl.engine.core.engine_settings import EngineConfig, EngineSettings
from fleetctl.engine.core.llm_engine import LLMEngine
from fleetctl.engine.core.sequence import SamplingParams
from fleetctl.engine.model.gguf_blocks import INT8_TYPES, read_int8_blocks
from fleetctl.engine.model.gguf_convert import unpermute_rotary
from fleetctl.engine.model.model_store import ModelStore
from fleetctl.engine.model.prepared import cache_path
from fleetctl.engine.model.quantize import MATRICES, SPLIT_TYPES, resolve_quantization, weight_source
from fleetctl.kernels.quantized_linear import QuantFormat, int8_split, round_int8_groups
from fleetctl.tests.support.gguf_parts import check_parts
from fleetctl.tests.support.tiny_wheel import write_tiny_gguf

Q8_0, Q5_0, Q5_1 = gguf.GGMLQuantizationType.Q8_0, gguf.GGMLQuantizationType.Q5_0, gguf.GGMLQuantizationType.Q5_1
Q4_1, F16 = gguf.GGMLQuantizationType.Q4_1, gguf.GGMLQuantizationType.F16
PROMPTS = ["The quick brown fox", "Once upon a time", "def add(a, b):"]
EXACT_MIX = {"blk.0.attn_v.weight": Q5_0, "blk.1.attn_q.weight": Q5_1, "blk.1.ffn_down.weight": Q4_1}
VARIANTS = {"Q8_0": ({}, "int8-gguf"), "Q8_0-Q5-Q4": (EXACT_MIX, "int8-gguf"),
            "with-F16": ({**EXACT_MIX, "blk.2.ffn_up.weight": F16}, "int8-gguf-mixed")}


def _tensor(tmp_path: Path, qtype: gguf.GGMLQuantizationType, weights: np.ndarray) -> gguf.ReaderTensor:
    writer = gguf.GGUFWriter(tmp_path / f"{qtype.name}.gguf", "llama")
    writer.add_tensor("blk.0.attn_q.weight", gguf.quants.quantize(weights, qtype), raw_dtype=qtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return gguf.GGUFReader(tmp_path / f"{qtype.name}.gguf").tensors[0]


@pytest.mark.parametrize("qtype", list(INT8_TYPES), ids=lambda t: t.name)
def test_blocks_and_their_int8_split_layout_are_the_gguf_packages_dequantization_exactly(
        qtype: gguf.GGMLQuantizationType, tmp_path: Path) -> None:
    rng = np.random.default_rng(qtype.value)
    weights = (rng.standard_normal((16, 256)) * 2.0 ** rng.uniform(-6, 0, (16, 1)) + 0.01).astype(np.float32)
    tensor = _tensor(tmp_path, qtype, weights)
    reference = gguf.quants.dequantize(tensor.data, qtype)
    blocks = read_int8_blocks(tensor)
    assert np.array_equal(blocks.dequantize().numpy(), reference)
    layout = int8_split(blocks.codes, blocks.scales, blocks.offsets, torch.float32)
    assert layout.format is QuantFormat.INT8_SPLIT
    assert np.array_equal(layout.dequantize().numpy(), reference)
    assert np.array_equal(read_int8_blocks(tensor, heads=4).dequantize().numpy(), unpermute_rotary(reference, 4))


@pytest.fixture(scope="module", params=list(VARIANTS))
def q8_model(request: pytest.FixtureRequest, tiny_model_dir: Path,
             tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, gguf.GGMLQuantizationType], str]:
    """The tiny model pulled from a Q8_0 (or mixed) GGUF, the types not Q8_0, and the int8 label it gets."""
    types, label = VARIANTS[request.param]
    root = tmp_path_factory.mktemp("q8-store")
    path = write_tiny_gguf(tiny_model_dir, root / "tiny.gguf", Q8_0, types)
    return ModelStore(root / "models").import_gguf(f"tiny-{request.param.lower()}", path, "test"), types, label


def test_int8_serves_the_shipped_blocks_bit_for_bit_and_rounds_the_rest(
        q8_model: tuple[Path, dict[str, gguf.GGMLQuantizationType], str]) -> None:
    model_dir, types, label = q8_model
    assert resolve_quantization(Quantization.AUTO, model_dir) is Quantization.NONE  # auto takes 4-bit files only
    assert weight_source(Quantization.INT8, 32, model_dir) == label

    def engine(quantization: Quantization) -> LLMEngine:
        settings = EngineSettings(dtype="float32", quantization=quantization, num_kv_blocks=64)
        return LLMEngine(EngineConfig(model_dir, settings=settings))

    int8, dense = engine(Quantization.INT8), engine(Quantization.NONE)
    assert int8.weight_format == label and int8.weights_label == label
    assert cache_path(model_dir, torch.float32, label).is_file()
    assert all(getattr(layer, name).format is QuantFormat.INT8_SPLIT
               for layer in int8.model.weights.layers for name in MATRICES)
    shipped, rounded = check_parts(int8, model_dir, SPLIT_TYPES,
                                   lambda rows: int8_split(*round_int8_groups(rows), torch.float32).dequantize())
    assert (shipped, rounded) == (21 - (F16 in types.values()), int(F16 in types.values()))
    if not rounded:  # every weight is the dense model's: the same tokens (a rounded part may tip the random model)
        params = SamplingParams(max_tokens=16, temperature=0.0, ignore_eos=True)
        outputs = [[r.token_ids for r in e.generate(PROMPTS, params)] for e in (int8, dense)]
        assert outputs[0] == outputs[1]
    # a byte a weight, and float32 scales and zeros of both halves per group of 32: 1.5 of float32's 4 bytes
    assert int8.model.weights.layer_matrix_bytes == dense.model.weights.layer_matrix_bytes * 3 // 8


def test_a_gguf_of_4_bit_blocks_keeps_int8_per_channel(tiny_model_dir: Path, tmp_path: Path) -> None:
    path = write_tiny_gguf(tiny_model_dir, tmp_path / "tiny.gguf", Q4_1)
    model_dir = ModelStore(tmp_path / "models").import_gguf("tiny-q4-1", path, "test")
    assert weight_source(Quantization.INT8, 32, model_dir) == "int8"
