"""Rotary position embedding tables for a model config: its rope_scaling (linear, llama3, yarn, longrope's
short or long factors) on the global layers, and a family's own unscaled base on its windowed layers (Gemma 3)."""

import math

import torch

from fleetctl.engine.model.model_config import ModelConfig, ModelConfigError


def rope_tables(config: ModelConfig, local: bool, dtype: torch.dtype, device: torch.device,
                long_factors: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin: [max_position_embeddings, rotary_dim/2] in `dtype` (as Hugging Face applies them), times the
    scaling's attention factor; `local`: the windowed layers' tables (Gemma 3's rope_local_base_freq);
    `long_factors`: longrope's long set (ModelConfig.long_rope)."""
    if local:
        inv_freq = _default(config.traits.local_rope_theta or config.rope_theta, config.rotary_dim)
        attention_factor = 1.0
    else:
        inv_freq, attention_factor = inverse_frequencies(config, long_factors)
    positions = torch.arange(config.max_position_embeddings, dtype=torch.float32)
    freqs = torch.outer(positions, inv_freq)  # [P, rotary_dim/2]
    cos, sin = freqs.cos() * attention_factor, freqs.sin() * attention_factor
    return cos.to(device=device, dtype=dtype), sin.to(device=device, dtype=dtype)


def inverse_frequencies(config: ModelConfig, long_factors: bool = False) -> tuple[torch.Tensor, float]:
    """[rotary_dim/2] float32 rotary frequencies with the config's rope_scaling applied, and the factor that
    scales cos and sin (1 but for yarn and longrope); `long_factors` picks longrope's long set."""
    dim = config.rotary_dim
    inv_freq = _default(config.rope_theta, dim)
    scaling = dict(config.rope_scaling)
    kind = scaling.get("rope_type", scaling.get("type"))
    if kind in (None, "default"):
        return inv_freq, 1.0
    if kind == "linear":
        return inv_freq / float(scaling["factor"]), 1.0
    if kind == "llama3":
        return _llama3_scaling(inv_freq, scaling), 1.0
    if kind == "yarn":
        return _yarn(config, scaling)
    if kind == "longrope":
        return _longrope(config, scaling, long_factors)
    raise ModelConfigError(f"config.json: unsupported rope_scaling type {kind!r}")


def _default(theta: float, dim: int) -> torch.Tensor:
    return 1.0 / _wavelength_powers(theta, dim)


def _wavelength_powers(theta: float, dim: int) -> torch.Tensor:
    """[dim/2] theta^(2i/dim), computed as transformers does (its scalings divide by it in one step)."""
    return theta ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim)


def _llama3_scaling(inv_freq: torch.Tensor, scaling: dict) -> torch.Tensor:
    factor = float(scaling["factor"])
    low = float(scaling.get("low_freq_factor", 1.0))
    high = float(scaling.get("high_freq_factor", 4.0))
    original = float(scaling["original_max_position_embeddings"])
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > original / low, inv_freq / factor, inv_freq)
    smooth = (original / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = (wavelen >= original / high) & (wavelen <= original / low)
    return torch.where(medium, smoothed, scaled)


def _yarn(config: ModelConfig, scaling: dict) -> tuple[torch.Tensor, float]:
    """YaRN (arXiv 2309.00071): interpolate the slow dims by `factor`, keep the fast ones, ramp between."""
    dim, base = config.rotary_dim, config.rope_theta
    original = float(scaling["original_max_position_embeddings"])
    factor = float(scaling.get("factor") or config.max_position_embeddings / original)

    def mscale(scale: float, weight: float = 1.0) -> float:
        return 1.0 if scale <= 1 else 0.1 * weight * math.log(scale) + 1.0

    attention_factor = scaling.get("attention_factor")
    if attention_factor is None:
        weight, all_dims = scaling.get("mscale"), scaling.get("mscale_all_dim")
        attention_factor = mscale(factor, weight) / mscale(factor, all_dims) if weight and all_dims else mscale(factor)

    def correction_dim(rotations: float) -> float:  # the dim that turns `rotations` times over the original length
        return dim * math.log(original / (rotations * 2 * math.pi)) / (2 * math.log(base))

    low = correction_dim(float(scaling.get("beta_fast") or 32))
    high = correction_dim(float(scaling.get("beta_slow") or 1))
    if scaling.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001
    ramp = ((torch.arange(dim // 2, dtype=torch.float32) - low) / (high - low)).clamp(0, 1)
    powers = _wavelength_powers(base, dim)
    keep = 1 - ramp  # 1: the dim keeps its frequency, 0: it is interpolated
    return 1.0 / (factor * powers) * (1 - keep) + 1.0 / powers * keep, float(attention_factor)


def _longrope(config: ModelConfig, scaling: dict, long_factors: bool) -> tuple[torch.Tensor, float]:
    """LongRoPE (Phi-3): per-dim rescale factors, the short set or the long one (one attention factor for both)."""
    original = float(scaling["original_max_position_embeddings"])
    factor = float(scaling.get("factor") or config.max_position_embeddings / original)
    attention_factor = scaling.get("attention_factor")
    if attention_factor is None:
        attention_factor = 1.0 if factor <= 1 else math.sqrt(1 + math.log(factor) / math.log(original))
    factors = torch.tensor(scaling["long_factor" if long_factors else "short_factor"], dtype=torch.float32)
    return 1.0 / (factors * _wavelength_powers(config.rope_theta, config.rotary_dim)), float(attention_factor)
