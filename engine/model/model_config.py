"""The model's shape, read from a Hugging Face `config.json`, with what its family changes (families/)."""

import json
from dataclasses import dataclass, field
from pathlib import Path

from fleetctl.engine.model.families.base import ModelConfigError, Traits
from fleetctl.engine.model.families.registry import SUPPORTED_ARCHITECTURES, family_for

__all__ = ["SUPPORTED_ARCHITECTURES", "ModelConfig", "ModelConfigError"]


@dataclass(frozen=True)
class ModelConfig:
    architecture: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    max_position_embeddings: int
    tie_word_embeddings: bool
    attention_bias: bool = False
    rope_scaling: tuple[tuple[str, object], ...] = ()  # the global layers' rope_type and its parameters
    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = ()
    family: str = "llama"
    traits: Traits = field(default_factory=Traits)

    def __post_init__(self) -> None:
        if self.architecture not in SUPPORTED_ARCHITECTURES:
            raise ModelConfigError(
                f"unsupported architecture {self.architecture!r}; supported: {', '.join(SUPPORTED_ARCHITECTURES)}"
            )
        for name in ("vocab_size", "hidden_size", "intermediate_size", "num_layers", "num_heads",
                     "num_kv_heads", "head_dim", "max_position_embeddings"):
            if getattr(self, name) <= 0:
                raise ModelConfigError(f"config.json: {name} must be positive, got {getattr(self, name)}")
        if self.num_heads % self.num_kv_heads:
            raise ModelConfigError("config.json: num_attention_heads must be a multiple of num_key_value_heads")
        if self.rotary_dim % 2 or self.rotary_dim <= 0:
            raise ModelConfigError("config.json: the rotated part of head_dim must be even and positive")
        if self.traits.layer_windows and len(self.traits.layer_windows) != self.num_layers:
            raise ModelConfigError(
                f"config.json: layer_types names {len(self.traits.layer_windows)} layers, "
                f"the model has {self.num_layers}")

    @classmethod
    def from_file(cls, path: Path) -> "ModelConfig":
        try:
            raw = json.loads(path.read_text())
        except FileNotFoundError:
            raise ModelConfigError(f"{path} does not exist") from None
        except json.JSONDecodeError as exc:
            raise ModelConfigError(f"{path} is not valid JSON: {exc}") from None
        return cls.from_dict(raw)

    @classmethod
    def from_dict(cls, raw: dict) -> "ModelConfig":
        family = family_for(raw)
        try:
            heads = int(raw["num_attention_heads"])
            hidden = int(raw["hidden_size"])
            layers = int(raw["num_hidden_layers"])
            eos = raw.get("eos_token_id")
            eos_ids = tuple(eos) if isinstance(eos, list) else (() if eos is None else (int(eos),))
            rope = _global_rope(raw)
            return cls(
                architecture=(raw.get("architectures") or [family.architectures[0]])[0],
                vocab_size=int(raw["vocab_size"]),
                hidden_size=hidden,
                intermediate_size=int(raw["intermediate_size"]),
                num_layers=layers,
                num_heads=heads,
                num_kv_heads=int(raw.get("num_key_value_heads") or heads),
                head_dim=int(raw.get("head_dim") or hidden // heads),
                rms_norm_eps=float(raw.get("rms_norm_eps", 1e-6)),
                rope_theta=float(rope.get("rope_theta", raw.get("rope_theta", 10000.0))),
                max_position_embeddings=int(raw.get("max_position_embeddings", 2048)),
                tie_word_embeddings=bool(raw.get("tie_word_embeddings", False)),
                attention_bias=family.has_qkv_bias(raw),
                rope_scaling=tuple(sorted((k, tuple(v) if isinstance(v, list) else v) for k, v in rope.items()
                                          if k not in ("rope_theta", "partial_rotary_factor"))),
                bos_token_id=raw.get("bos_token_id"),
                eos_token_ids=eos_ids,
                family=family.name,
                traits=family.traits(raw, layers),
            )
        except (KeyError, TypeError, ValueError) as exc:  # a family's own ModelConfigError passes through
            raise ModelConfigError(f"config.json: missing or invalid field {exc}") from None

    @property
    def rotary_dim(self) -> int:
        """The dims of each head that rotate (the first ones; the rest pass through)."""
        return int(self.head_dim * self.traits.partial_rotary_factor)

    @property
    def max_context(self) -> int:
        """The longest sequence this engine runs the model at: its max_position_embeddings."""
        return self.max_position_embeddings

    def long_rope(self, max_model_len: int) -> bool:
        """Whether an engine that runs sequences up to `max_model_len` rotates with longrope's long factors:
        when it may run past the original length (llama.cpp's rule: one table per engine, so every cached key
        was rotated as the next query is; transformers switches a whole sequence's table as it crosses the
        length, which re-rotates keys a KV cache already holds)."""
        scaling = dict(self.rope_scaling)
        if scaling.get("rope_type") != "longrope":
            return False
        return max_model_len > int(scaling.get("original_max_position_embeddings") or self.max_position_embeddings)

    @property
    def kv_window(self) -> int | None:
        """How far behind its query the oldest key any layer attends to lies, when every layer has a sliding
        window (the widest); None when some layer attends to every key."""
        windows = self.traits.layer_windows
        if not windows or any(w is None for w in windows):
            return None
        return max(w for w in windows if w is not None)

    @property
    def widest_window(self) -> int | None:
        """The widest sliding window of any layer (None: no layer has one)."""
        windows = [w for w in self.traits.layer_windows if w is not None]
        return max(windows) if windows else None

    @property
    def windowed_layers(self) -> tuple[int, ...]:
        """The layers with a sliding window, when others attend to every key (Gemma 3's 5 in 6, Qwen2's from
        max_window_layers on): their K/V lives in a pool of its own, bounded (core/kv_cache); else ()."""
        windows = self.traits.layer_windows
        if not windows or all(w is not None for w in windows):
            return ()
        return tuple(i for i, w in enumerate(windows) if w is not None)

    @property
    def num_params(self) -> int:
        """Parameters that take part in each token's matmuls (embedding lookup excluded)."""
        attn = self.hidden_size * self.head_dim * (2 * self.num_heads + 2 * self.num_kv_heads)
        mlp = 3 * self.hidden_size * self.intermediate_size
        return self.num_layers * (attn + mlp) + self.vocab_size * self.hidden_size


def _global_rope(raw: dict) -> dict:
    """The (global layers') rope parameters: transformers 5's `rope_parameters` (per layer type where the family
    has several), else the older `rope_theta` + `rope_scaling`."""
    rope = raw.get("rope_parameters")
    if rope:
        rope = rope.get("full_attention", rope)
    else:
        rope = dict(raw.get("rope_scaling") or {})
        if "type" in rope:
            rope["rope_type"] = rope.pop("type")
    rope = dict(rope)
    if rope.get("rope_type") in ("llama3", "yarn", "longrope"):
        if "original_max_position_embeddings" in raw:  # Phi-3 keeps it outside, and transformers prefers it
            rope["original_max_position_embeddings"] = raw["original_max_position_embeddings"]
        rope.setdefault("original_max_position_embeddings", raw.get("max_position_embeddings", 2048))
    return rope
