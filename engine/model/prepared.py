"""A cache of weights already in the engine's layout (Q/K/V and gate/up fused, in the target dtype and
weight format), so later loads on a CPU memory-map them with no copy. Worker processes on one machine then
share one copy of the weights in the page cache.

`$FLEET_HOME/cache/weights/<model>-<key>-<dtype>[-<format>].safetensors`, written to a temporary name and
renamed, so a killed write never leaves a file that looks complete. The key changes whenever the source
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

from fleetctl.domain import Quantization
from fleetctl.engine.model.loader import load_weights, weight_files
from fleetctl.engine.model.model_config import ModelConfig
from fleetctl.engine.model.model_store import MANIFEST
from fleetctl.engine.model.quantize import quantize_weights, weight_source
from fleetctl.engine.model.weights import LayerWeights, Matrix, ModelWeights
from fleetctl.engine.paths import fleet_home
from fleetctl.kernels.quantized_linear import QuantFormat, QuantizedWeight, with_gemm_layout

LAYER_FIELDS = [f.name for f in fields(LayerWeights)]
BUILD_TIMEOUT_S = 600.0  # a slow disk converting a large model; waiters then fall back to plain copies
# part of every cache key: bumped whenever a layout is built differently, so no file of the old build is mapped
# (2: a non-llama GGUF's 4-bit Q/K blocks had been un-permuted as llama's; 3: CPU int4 codes as q4 blocks; 4: a GGUF's
# Q8_0 head kept in its blocks)
LAYOUT_VERSION = 4


def weights_key(model_dir: Path) -> str:
    """Identifies the weights: their sha256 from the model store, else a digest of paths, sizes, mtimes."""
    manifest = model_dir / MANIFEST
    if manifest.exists():
        return json.loads(manifest.read_text())["weights_sha256"]
    parts = [f"{f.resolve()}:{f.stat().st_size}:{f.stat().st_mtime_ns}" for f in weight_files(model_dir)]
    return hashlib.sha256("|".join(parts).encode()).hexdigest()


def cache_path(model_dir: Path, dtype: torch.dtype, layout: str = "none") -> Path:
    """`layout` is `quantize.weight_source`'s name for the weight format (none: the dense weights)."""
    key = hashlib.sha256(f"{weights_key(model_dir)}|{model_dir.resolve()}|{LAYOUT_VERSION}".encode()).hexdigest()[:16]
    dtype_name = str(dtype).removeprefix("torch.")
    suffix = "" if layout == "none" else f"-{layout}"
    return fleet_home() / "cache" / "weights" / f"{model_dir.name}-{key}-{dtype_name}{suffix}.safetensors"


def _flatten(weights: ModelWeights) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """Tensors by name, and the metadata that rebuilds quantized matrices from their two tensors."""
    flat = {"embed": weights.embed, "final_norm": weights.final_norm}
    metadata: dict[str, str] = {}
    if isinstance(weights.lm_head, QuantizedWeight):  # a GGUF's Q8_0 head: its own format beside the layers'
        flat["lm_head.data"], flat["lm_head.scales"] = weights.lm_head.data, weights.lm_head.scales
        head = weights.lm_head
        metadata |= {"lm_head.format": head.format.value, "lm_head.group_size": str(head.group_size)}
    elif weights.lm_head is not weights.embed:
        flat["lm_head"] = weights.lm_head
    for i, layer in enumerate(weights.layers):
        for name in LAYER_FIELDS:
            tensor = getattr(layer, name)
            if isinstance(tensor, QuantizedWeight):
                flat[f"layers.{i}.{name}.data"], flat[f"layers.{i}.{name}.scales"] = tensor.data, tensor.scales
                metadata |= {"format": tensor.format.value, "group_size": str(tensor.group_size)}
            elif tensor is not None:
                flat[f"layers.{i}.{name}"] = tensor
    return flat, metadata


def _unflatten(flat: dict[str, torch.Tensor], metadata: dict[str, str], num_layers: int) -> ModelWeights:
    def field(key: str, prefix: str = "") -> Matrix | None:
        if f"{key}.data" not in flat:
            return flat.get(key)
        data, scales = _aligned(flat[f"{key}.data"]), _aligned(flat[f"{key}.scales"])
        fmt, group_size = QuantFormat(metadata[f"{prefix}format"]), int(metadata[f"{prefix}group_size"])
        if fmt is QuantFormat.INT8:
            return QuantizedWeight(fmt, scales.shape[0], data.shape[1], group_size, data, scales)
        packed_cols = scales.shape[0] * group_size  # int8-split packs its two halves over twice its inputs
        cols = packed_cols // 2 if fmt is QuantFormat.INT8_SPLIT else packed_cols
        return with_gemm_layout(QuantizedWeight(fmt, scales.shape[1], cols, group_size, data, scales))

    layers = [LayerWeights(**{name: field(f"layers.{i}.{name}") for name in LAYER_FIELDS}) for i in range(num_layers)]
    embed, head = flat["embed"], field("lm_head", "lm_head.")
    return ModelWeights(embed=embed, layers=layers, final_norm=flat["final_norm"],
                        lm_head=embed if head is None else head)


def _aligned(tensor: torch.Tensor) -> torch.Tensor:
    """The tensor itself when 64-byte aligned, else an aligned copy: safetensors aligns a tensor to 8 bytes only,
    and torch's int8 weight-only kernel reads past-aligned blocks (it crashed on a mapped weight at 8 bytes off)."""
    return tensor if tensor.data_ptr() % 64 == 0 else tensor.clone()


def load_cpu_weights(model_dir: Path, config: ModelConfig, dtype: torch.dtype,
                     quantization: Quantization = Quantization.NONE, group_size: int = 32) -> ModelWeights:
    """Weights on the CPU in `quantization` (resolved, not auto), memory-mapped from the prepared cache
    (building it on first use). Workers starting together take a file lock, so one builds the cache and the
    others map it."""
    path = cache_path(model_dir, dtype, weight_source(quantization, group_size, model_dir))

    def build() -> ModelWeights:
        dense = load_weights(model_dir, config, dtype, torch.device("cpu"))
        return quantize_weights(dense, quantization, group_size, model_dir, config)

    if not path.exists():
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            with FileLock(f"{path}.lock", timeout=BUILD_TIMEOUT_S):
                if not path.exists():  # another worker may have built it while this one waited
                    _save(build(), path)
        except (OSError, Timeout):
            return build()  # e.g. a read-only home
    with safe_open(str(path), framework="pt") as handle:
        flat = {name: handle.get_tensor(name) for name in handle.keys()}  # noqa: SIM118
        metadata = handle.metadata() or {}
    return _unflatten(flat, metadata, config.num_layers)


def _save(weights: ModelWeights, path: Path) -> None:
    flat, metadata = _flatten(weights)
    partial = path.with_name(f".{path.name}.{os.getpid()}.partial")
    save_file({k: v.contiguous() for k, v in flat.items()}, str(partial), metadata=metadata or None)
    os.replace(partial, path)
