"""A cache of weights already in the engine's layout (Q/K/V and gate/up fused, in the target dtype),
so later loads on a CPU memory-map them with no copy. Worker processes on one machine then share one
copy of the weights in the page cache.

`$FLEET_HOME/cache/weights/<model>-<key>-<dtype>.safetensors`, written to a temporary name and renamed,
so a killed write never leaves a file that looks complete. The key changes whenever the source
weights do (their sha256 from the model store, else their paths, sizes and modification times).
"""

import hashlib
import json
import os
from dataclasses import fields
from pathlib import Path

import torch
from filelock import FileLock, Timeout
from safetensors import safe_open
from safetensors.torch import save_file

from fleetctl.engine.model.config import ModelConfig
from fleetctl.engine.model.llama import LayerWeights, LlamaWeights
from fleetctl.engine.model.loader import load_weights, weight_files
from fleetctl.engine.model.store import MANIFEST
from fleetctl.engine.paths import fleet_home

LAYER_FIELDS = [f.name for f in fields(LayerWeights)]
BUILD_TIMEOUT_S = 600.0  # a slow disk converting a large model; waiters then fall back to plain copies


def weights_key(model_dir: Path) -> str:
    """Identifies the weights: their sha256 from the model store, else a digest of paths, sizes, mtimes."""
    manifest = model_dir / MANIFEST
    if manifest.exists():
        return json.loads(manifest.read_text())["weights_sha256"]
    parts = [f"{f.resolve()}:{f.stat().st_size}:{f.stat().st_mtime_ns}" for f in weight_files(model_dir)]
    return hashlib.sha256("|".join(parts).encode()).hexdigest()


def cache_path(model_dir: Path, dtype: torch.dtype) -> Path:
    key = hashlib.sha256(f"{weights_key(model_dir)}|{model_dir.resolve()}".encode()).hexdigest()[:16]
    dtype_name = str(dtype).removeprefix("torch.")
    return fleet_home() / "cache" / "weights" / f"{model_dir.name}-{key}-{dtype_name}.safetensors"


def _flatten(weights: LlamaWeights) -> dict[str, torch.Tensor]:
    flat = {"embed": weights.embed, "final_norm": weights.final_norm}
    if weights.lm_head is not weights.embed:
        flat["lm_head"] = weights.lm_head
    for i, layer in enumerate(weights.layers):
        for name in LAYER_FIELDS:
            if (tensor := getattr(layer, name)) is not None:
                flat[f"layers.{i}.{name}"] = tensor
    return flat


def _unflatten(flat: dict[str, torch.Tensor], num_layers: int) -> LlamaWeights:
    layers = [LayerWeights(**{name: flat.get(f"layers.{i}.{name}") for name in LAYER_FIELDS})
              for i in range(num_layers)]
    embed = flat["embed"]
    return LlamaWeights(embed=embed, layers=layers, final_norm=flat["final_norm"], lm_head=flat.get("lm_head", embed))


def load_cpu_weights(model_dir: Path, config: ModelConfig, dtype: torch.dtype) -> LlamaWeights:
    """Weights on the CPU, memory-mapped from the prepared cache (building it on first use). Workers
    starting together take a file lock, so one builds the cache and the others map it."""
    path = cache_path(model_dir, dtype)
    if not path.exists():
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            with FileLock(f"{path}.lock", timeout=BUILD_TIMEOUT_S):
                if not path.exists():  # another worker may have built it while this one waited
                    _build(model_dir, config, dtype, path)
        except (OSError, Timeout):
            return load_weights(model_dir, config, dtype, torch.device("cpu"))  # e.g. a read-only home
    with safe_open(str(path), framework="pt") as handle:
        flat = {name: handle.get_tensor(name) for name in handle.keys()}  # noqa: SIM118
    return _unflatten(flat, config.num_layers)


def _build(model_dir: Path, config: ModelConfig, dtype: torch.dtype, path: Path) -> None:
    weights = load_weights(model_dir, config, dtype, torch.device("cpu"))
    partial = path.with_name(f".{path.name}.{os.getpid()}.partial")
    save_file({k: v.contiguous() for k, v in _flatten(weights).items()}, str(partial))
    os.replace(partial, path)
