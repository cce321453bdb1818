"""Whether an engine's decode steps run compiled (`--compile on|off`), and where inductor keeps what it
compiled: `$FLEET_HOME/cache/inductor`, so a restarted worker loads its graphs instead of compiling again."""

import os
import shutil

import torch

from fleetctl.engine.core.engine_settings import CompileMode, EngineConfig, KVDtype
from fleetctl.engine.model.compiled_decode import llama_shaped
from fleetctl.engine.model.model_config import ModelConfig
from fleetctl.engine.paths import fleet_home


def compile_refusal(config: EngineConfig, device: torch.device, quantized: bool = False,
                    model: ModelConfig | None = None) -> str | None:
    """Why this engine decodes eagerly, or None when it compiles its decode step (`quantized`: its layers'
    weights are int8/int4; `model`: the model's config, when read)."""
    settings = config.settings
    if settings.compile is CompileMode.OFF:
        return "--compile off"
    if settings.deterministic:
        return "deterministic mode runs eagerly (its batch invariance rests on fixed row tiles)"
    if config.prefill_only:
        return "a prefill worker does not decode"
    if quantized:
        return "quantized weights run eagerly (the compiled step multiplies dense ones)"
    if settings.kv_dtype is not KVDtype.AUTO:
        return f"a {settings.kv_dtype} KV pool decodes eagerly (the compiled step reads K/V in the model's dtype)"
    if model is not None and not llama_shaped(model):
        return f"the compiled step runs Llama-shaped layers only ({model.family} changes them)"
    if device.type == "cpu" and shutil.which(os.environ.get("CXX", "g++")) is None:
        return "no C++ compiler (g++) for inductor's CPU kernels"
    return None


def use_fleet_inductor_cache() -> None:
    """Point inductor's on-disk cache under $FLEET_HOME unless the environment already chose one."""
    os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", str(fleet_home() / "cache" / "inductor"))
