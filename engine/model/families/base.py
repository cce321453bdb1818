"""What a model family changes in the one decoder, and where its checkpoint keeps each tensor.

A family reads the architecture-specific fields of a Hugging Face `config.json` into `Traits` (torch-free:
the controller reads configs too) and names the checkpoint tensors behind each engine weight. Everything
else (shapes, rope, vocabulary) is common and read by `config.ModelConfig`.
"""

from dataclasses import dataclass
from enum import StrEnum

from fleetctl.errors import UserError


class ModelConfigError(UserError):
    """config.json is missing, malformed, or describes a model this engine cannot run."""


class Activation(StrEnum):
    """The gate's activation in the gated MLP (kernels/glu.py names the same values)."""

    SILU = "silu"  # SwiGLU
    GELU_TANH = "gelu_tanh"  # GeGLU, tanh approximation


_ACTIVATIONS = {"silu": Activation.SILU, "swish": Activation.SILU, "gelu_pytorch_tanh": Activation.GELU_TANH,
                "gelu_tanh": Activation.GELU_TANH}


@dataclass(frozen=True)
class Traits:
    """How a family's decoder layer differs from Llama's (the defaults)."""

    activation: Activation = Activation.SILU
    norm_offset: float = 0.0  # RMSNorm scales by (offset + weight): Gemma stores weight - 1
    qk_norm: bool = False  # RMSNorm over each head of q and k before the rotation (Qwen3, Gemma 3)
    scale_embedding: bool = False  # embeddings times sqrt(hidden_size), in the model's dtype (Gemma)
    query_scale: float | None = None  # attention's softmax scale; None: head_dim ** -0.5
    layer_windows: tuple[int | None, ...] = ()  # per layer: its sliding window in tokens, None global; (): all global
    local_rope_theta: float | None = None  # the windowed layers' own rope base, unscaled (Gemma 3)
    partial_rotary_factor: float = 1.0  # the share of each head's dims that rotate (Phi-3.5/4-mini)
    final_logit_softcap: float | None = None  # logits = cap * tanh(logits / cap)


TensorSpec = tuple[str, tuple[int, ...]]  # a checkpoint tensor's name and shape


@dataclass(frozen=True)
class Shapes:
    """The sizes a family needs to name its tensors (ModelConfig's, without importing it)."""

    hidden: int
    intermediate: int
    q_rows: int  # num_heads * head_dim
    kv_rows: int  # num_kv_heads * head_dim
    head_dim: int


class Family:
    """Llama's layout; subclasses override what their family changes."""

    name = "llama"
    model_types: tuple[str, ...] = ("llama",)
    architectures: tuple[str, ...] = ("LlamaForCausalLM",)
    qkv_bias = False  # Qwen2's q/k/v projections carry a bias

    def traits(self, raw: dict, num_layers: int) -> Traits:
        """The family's fields of config.json; raises ModelConfigError for a variant this engine cannot run."""
        return Traits(activation=activation(raw.get("hidden_act", "silu")),
                      layer_windows=_uniform_window(raw, num_layers))

    def has_qkv_bias(self, raw: dict) -> bool:
        return bool(raw.get("attention_bias", self.qkv_bias))

    def layer_tensors(self, layer: int, shapes: Shapes, traits: Traits, qkv_bias: bool) -> dict[str, list[TensorSpec]]:
        """Each engine weight of decoder layer `layer` (weights.LayerWeights' field names) from the checkpoint
        tensors fused in order into it."""
        p = f"model.layers.{layer}."
        attn, mlp = p + "self_attn.", p + "mlp."
        d, q, kv = shapes.hidden, shapes.q_rows, shapes.kv_rows
        names = {
            "input_norm": [(p + "input_layernorm.weight", (d,))],
            "qkv": [(attn + "q_proj.weight", (q, d)), (attn + "k_proj.weight", (kv, d)),
                    (attn + "v_proj.weight", (kv, d))],
            "o_proj": [(attn + "o_proj.weight", (d, q))],
            "post_norm": [(p + "post_attention_layernorm.weight", (d,))],
            "gate_up": [(mlp + "gate_proj.weight", (shapes.intermediate, d)),
                        (mlp + "up_proj.weight", (shapes.intermediate, d))],
            "down": [(mlp + "down_proj.weight", (d, shapes.intermediate))],
        }
        if qkv_bias:
            names["qkv_bias"] = [(attn + "q_proj.bias", (q,)), (attn + "k_proj.bias", (kv,)),
                                 (attn + "v_proj.bias", (kv,))]
        if traits.qk_norm:
            names["q_norm"] = [(attn + "q_norm.weight", (shapes.head_dim,))]
            names["k_norm"] = [(attn + "k_norm.weight", (shapes.head_dim,))]
        return names


NORM_FIELDS = ("input_norm", "post_norm", "q_norm", "k_norm", "attn_out_norm", "mlp_out_norm")  # take norm_offset


def activation(name: str) -> Activation:
    if name not in _ACTIVATIONS:
        raise ModelConfigError(f"config.json: unsupported activation {name!r}; supported: {', '.join(_ACTIVATIONS)}")
    return _ACTIVATIONS[name]


def _uniform_window(raw: dict, num_layers: int) -> tuple[int | None, ...]:
    """`layer_types` where config.json has them; else Mistral's `sliding_window` on every layer, and Qwen's
    only with `use_sliding_window`, on the layers from `max_window_layers` on (as transformers reads them)."""
    window = raw.get("sliding_window")
    if window is None or ("use_sliding_window" in raw and not raw["use_sliding_window"]):
        return ()
    layer_types = raw.get("layer_types")
    if layer_types:
        windows = tuple(int(window) if kind == "sliding_attention" else None for kind in layer_types)
    else:
        first_windowed = int(raw.get("max_window_layers", 0))
        windows = tuple(int(window) if i >= first_windowed else None for i in range(num_layers))
    return windows if any(windows) else ()
