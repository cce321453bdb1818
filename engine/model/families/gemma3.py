"""Gemma 3 (text): (1 + w) RMSNorm, norms around both the attention and the MLP, q/k norm, GeGLU, embeddings
scaled by sqrt(hidden), a query scale of its own, and sliding-window layers interleaved with global ones, each
kind with its own rope base."""

from fleetctl.engine.model.families.base import Family, ModelConfigError, Shapes, TensorSpec, Traits, activation

_SLIDING_PATTERN = 6  # before transformers wrote layer_types: every 6th layer global


class Gemma3(Family):
    name = "gemma3"
    model_types = ("gemma3_text",)
    architectures = ("Gemma3ForCausalLM",)

    def traits(self, raw: dict, num_layers: int) -> Traits:
        if raw.get("attn_logit_softcapping") is not None:
            raise ModelConfigError(
                "config.json: attention logit soft-capping (attn_logit_softcapping) is not supported")
        window = int(raw.get("sliding_window") or 4096)
        pattern = int(raw.get("sliding_window_pattern") or raw.get("_sliding_window_pattern") or _SLIDING_PATTERN)
        layer_types = raw.get("layer_types") or [
            "full_attention" if (i + 1) % pattern == 0 else "sliding_attention" for i in range(num_layers)]
        rope = raw.get("rope_parameters") or {}
        local = rope.get("sliding_attention") or {}
        return Traits(
            activation=activation(raw.get("hidden_activation") or raw.get("hidden_act") or "gelu_pytorch_tanh"),
            norm_offset=1.0,
            qk_norm=True,
            scale_embedding=True,
            query_scale=float(raw.get("query_pre_attn_scalar") or _head_dim(raw)) ** -0.5,
            layer_windows=tuple(window if kind == "sliding_attention" else None for kind in layer_types),
            local_rope_theta=float(local.get("rope_theta") or raw.get("rope_local_base_freq") or 10000.0),
            final_logit_softcap=raw.get("final_logit_softcapping"),
        )

    def layer_tensors(self, layer: int, shapes: Shapes, traits: Traits, qkv_bias: bool) -> dict[str, list[TensorSpec]]:
        names = super().layer_tensors(layer, shapes, traits, qkv_bias)
        p, d = f"model.layers.{layer}.", (shapes.hidden,)
        names["attn_out_norm"] = [(p + "post_attention_layernorm.weight", d)]
        names["post_norm"] = [(p + "pre_feedforward_layernorm.weight", d)]
        names["mlp_out_norm"] = [(p + "post_feedforward_layernorm.weight", d)]
        return names


def _head_dim(raw: dict) -> int:
    return int(raw.get("head_dim") or int(raw["hidden_size"]) // int(raw["num_attention_heads"]))
