"""Q4_K blocks served as they ship, and Q4_K_M files that mix them with other types: random Q4_K blocks read
back are `gguf`'s own dequantization; a tiny model (hidden sizes in multiples of 256, as K-quants need) written
as a Q4_K GGUF and as a Q4_K_M-like one (some parts of fused matrices Q6_K or Q8_0), imported into a model store
and loaded at int4, holds the shipped blocks bit for bit at float32, rounds the other parts to nearest from the
converted float weights, and decodes the dense model's greedy tokens."""

from pathlib import Path

import gguf
import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

from fleetctl.domain import Quantization
from fleetctl.engine.core.engine_settings import EngineConfig, EngineSettings
from fleetctl.engine.core.llm_engine import LLMEngine
from fleetctl.engine.core.sequence import SamplingParams
from fleetctl.engine.model import quantize
from fleetctl.engine.model.gguf_blocks import INT4_TYPES, read_int4_blocks
from fleetctl.engine.model.gguf_convert import _LAYER_TENSORS, unpermute_rotary
from fleetctl.engine.model.loader import load_weights
from fleetctl.engine.model.model_config import ModelConfig
from fleetctl.engine.model.model_store import MANIFEST, SOURCE_GGUF, ModelStore
from fleetctl.engine.model.prepared import cache_path
from fleetctl.engine.model.quantize import resolve_quantization, weight_source
from fleetctl.kernels.quantized_linear import quantize_int4
from fleetctl.tests.support.gguf_parts import check_parts
from fleetctl.tests.support.tiny_model import write_tiny_llama
from fleetctl.tests.support.tiny_wheel import write_tiny_gguf

Q4_K, Q6_K, Q8_0 = gguf.GGMLQuantizationType.Q4_K, gguf.GGMLQuantizationType.Q6_K, gguf.GGMLQuantizationType.Q8_0
PROMPTS = ["The quick brown fox", "Once upon a time", "def add(a, b):"]
# as llama.cpp's Q4_K_M does, some layers' attn_v and ffn_down in Q6_K; a Q8_0 part too; 83 % of weights Q4_K
MIXED = {"blk.0.attn_v.weight": Q6_K, "blk.1.ffn_down.weight": Q6_K, "blk.2.ffn_up.weight": Q8_0}
VARIANTS = {"Q4_K": ({}, "int4-gguf"), "Q4_K_M": (MIXED, "int4-gguf-mixed")}


def _raw_q4_k(tmp_path: Path, d: np.ndarray, dmin: np.ndarray, rng: np.random.Generator) -> gguf.ReaderTensor:
    """A Q4_K tensor of d.shape = [rows, super-blocks per row] blocks: those d and dmin, random scale/min and code
    bytes (every byte pattern is a valid block), written to a GGUF and read back."""
    raw = rng.integers(0, 256, (*d.shape, 144), dtype=np.uint8)
    raw[..., 0:2] = d.astype(np.float16)[..., None].view(np.uint8)
    raw[..., 2:4] = dmin.astype(np.float16)[..., None].view(np.uint8)
    writer = gguf.GGUFWriter(tmp_path / "q4k.gguf", "llama")
    writer.add_tensor("blk.0.attn_q.weight", raw.reshape(d.shape[0], -1), raw_dtype=Q4_K)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return gguf.GGUFReader(tmp_path / "q4k.gguf").tensors[0]


def test_q4_k_blocks_read_back_are_the_gguf_packages_dequantization_exactly(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    d = 2 ** rng.uniform(-13, -8, (16, 3))  # weights up to 945·d: 0.1 to 3.7
    dmin = d * 2 ** rng.uniform(-3, 3, d.shape)  # within a few binades of d, as llama.cpp's quantizer makes them
    tensor = _raw_q4_k(tmp_path, d, dmin, rng)
    reference = gguf.quants.dequantize(tensor.data, Q4_K)
    assert reference.shape == (16, 768) and np.isfinite(reference).all()
    # Exact, though the order differs: gguf rounds d·sc·q − dmin·m once, the int4 layout (q − 8)·s + z rounds
    # the zero z = 8·d·sc − dmin·m and then the sum; with d and dmin this close, z is a float32 (no rounding), so
    # the sum is d·sc·q − dmin·m rounded once too.
    assert np.array_equal(read_int4_blocks(tensor).dequantize().numpy(), reference)
    assert np.array_equal(read_int4_blocks(tensor, heads=4).dequantize().numpy(), unpermute_rotary(reference, 4))


def test_q4_k_blocks_with_far_apart_d_and_dmin_are_within_an_ulp_of_their_zero(tmp_path: Path) -> None:
    rng = np.random.default_rng(1)
    d = 2 ** rng.uniform(-13, -8, (16, 3))
    dmin = d * 2 ** rng.uniform(-12, 12, d.shape)  # no quantizer makes these: z = 8·d·sc − dmin·m needs rounding
    tensor = _raw_q4_k(tmp_path, d, dmin, rng)
    reference = gguf.quants.dequantize(tensor.data, Q4_K)
    blocks = read_int4_blocks(tensor)
    ours = blocks.dequantize().numpy()
    # the zero's rounding (half its ulp), then the sum's and gguf's (half an ulp of the weight each)
    bound = np.spacing(np.abs(blocks.zeros.numpy())).repeat(32, axis=1) + np.spacing(np.abs(reference))
    assert (np.abs(ours - reference) <= bound).all()
    assert not np.array_equal(ours, reference)  # the case is real: some weights differ


@pytest.fixture(scope="module")
def k_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny model with every matrix's inputs a multiple of 256 (K-quants' super-block)."""
    return write_tiny_llama(tmp_path_factory.mktemp("tiny-k"), hidden_size=256, intermediate_size=512, head_dim=64)


def _pulled(k_model_dir: Path, root: Path, name: str, types: dict[str, gguf.GGMLQuantizationType]) -> Path:
    path = write_tiny_gguf(k_model_dir, root / f"{name}.gguf", Q4_K, types)
    return ModelStore(root / "models").import_gguf(name, path, "test")


KModel = tuple[Path, dict[str, gguf.GGMLQuantizationType], str]


@pytest.fixture(scope="module", params=list(VARIANTS))
def k_model(request: pytest.FixtureRequest, k_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> KModel:
    """The tiny model pulled from a Q4_K (or Q4_K_M-like) GGUF, the types not Q4_K, and the int4 label it gets."""
    types, label = VARIANTS[request.param]
    root = tmp_path_factory.mktemp("q4k-store")
    return _pulled(k_model_dir, root, f"tiny-{request.param.lower()}", types), types, label


def test_auto_is_int4_and_the_label_says_whether_every_matrix_shipped_in_4_bits(k_model: KModel) -> None:
    model_dir, _, label = k_model
    assert resolve_quantization(Quantization.AUTO, model_dir) is Quantization.INT4
    assert weight_source(Quantization.INT4, 32, model_dir) == label
    assert weight_source(Quantization.INT4, 64, model_dir) == "int4-g64"  # other groups: round-to-nearest


def test_auto_wants_most_of_the_layer_weights_shipped_in_4_bits(k_model_dir: Path, tmp_path: Path) -> None:
    down_and_up = {f"blk.{i}.{kind}.weight": Q6_K for i in range(3) for kind in ("ffn_up", "ffn_down")}
    model_dir = _pulled(k_model_dir, tmp_path, "tiny-mostly-q6k", down_and_up)  # 56 % of the weights Q4_K
    assert resolve_quantization(Quantization.AUTO, model_dir) is Quantization.NONE
    assert weight_source(Quantization.INT4, 32, model_dir) == "int4-gguf-mixed"  # asked for: what ships, and RTN


def test_int4_serves_the_shipped_q4_k_blocks_bit_for_bit_and_rounds_the_rest(k_model: KModel, tmp_path: Path) -> None:
    model_dir, types, label = k_model

    def engine(quantization: Quantization, directory: Path = model_dir) -> LLMEngine:
        settings = EngineSettings(dtype="float32", quantization=quantization, num_kv_blocks=64)
        return LLMEngine(EngineConfig(directory, settings=settings))

    int4 = engine(Quantization.AUTO)
    assert int4.weight_format == label and int4.weights_label == label
    assert cache_path(model_dir, torch.float32, label).is_file()
    counts = check_parts(int4, model_dir, INT4_TYPES, lambda rows: quantize_int4(rows, 32).dequantize())
    assert counts == (21 - len(types), len(types))  # 3 layers of 7
    # the dense float32 run of what int4 serves: for the Q4_K file the model itself; for the mixed one its copy
    # with the re-rounded parts (they differ too much from the float weights to keep the random tiny model's
    # greedy tokens)
    dense = engine(Quantization.NONE, _dense_copy(model_dir, types, tmp_path) if types else model_dir)
    assert dense.weights_label == "float32"
    params = SamplingParams(max_tokens=16, temperature=0.0, ignore_eos=True)
    outputs = [[r.token_ids for r in e.generate(PROMPTS, params)] for e in (int4, dense)]
    assert outputs[0] == outputs[1]


def _dense_copy(model_dir: Path, types: dict[str, gguf.GGMLQuantizationType], tmp_path: Path) -> Path:
    """A plain directory of `model_dir`'s converted weights (no GGUF), the matrices `types` names rounded to nearest
    at int4 in groups of 32, as an int4 engine rounds them."""
    out = tmp_path / "served"
    out.mkdir()
    for path in model_dir.iterdir():
        if path.name not in {SOURCE_GGUF, MANIFEST, "model.safetensors"}:
            (out / path.name).symlink_to(path)
    tensors = load_file(model_dir / "model.safetensors")
    for name in types:
        _, layer, kind, _ = name.split(".")
        hf_name = f"model.layers.{layer}.{_LAYER_TENSORS[kind]}.weight"
        tensors[hf_name] = quantize_int4(tensors[hf_name], 32).dequantize().contiguous()
    save_file(tensors, out / "model.safetensors")
    return out


def test_a_load_reads_the_gguf_once(k_model: KModel, monkeypatch: pytest.MonkeyPatch) -> None:
    model_dir, _, label = k_model
    opened: list[Path] = []

    class CountingReader(gguf.GGUFReader):
        def __init__(self, path: Path) -> None:
            opened.append(path)
            super().__init__(path)

    monkeypatch.setattr(gguf, "GGUFReader", CountingReader)
    quantize._read_layer_matrices.cache_clear()
    config = ModelConfig.from_file(model_dir / "config.json")
    dense = load_weights(model_dir, config, torch.float32, torch.device("cpu"))
    assert resolve_quantization(Quantization.AUTO, model_dir) is Quantization.INT4  # as an engine's load asks
    assert weight_source(Quantization.INT4, 32, model_dir) == label
    quantize.quantize_weights(dense, Quantization.INT4, 32, model_dir, config)
    assert opened == [(model_dir / SOURCE_GGUF).resolve()]
