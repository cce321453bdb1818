"""Phi-3 / Phi-3.5 / Phi-4-mini: q/k/v and gate/up stored fused, and (Phi-4-mini) only part of each head rotates."""

from dataclasses import replace

from fleetctl.engine.model.families.base import Family, Shapes, TensorSpec, Traits


class Phi3(Family):
    name = "phi3"
    model_types = ("phi3",)
    architectures = ("Phi3ForCausalLM",)

    def traits(self, raw: dict, num_layers: int) -> Traits:
        rope = raw.get("rope_parameters") or {}
        factor = rope.get("partial_rotary_factor", raw.get("partial_rotary_factor", 1.0))
        return replace(super().traits(raw, num_layers), partial_rotary_factor=float(factor))

    def layer_tensors(self, layer: int, shapes: Shapes, traits: Traits, qkv_bias: bool) -> dict[str, list[TensorSpec]]:
        names = super().layer_tensors(layer, shapes, traits, qkv_bias)
        p = f"model.layers.{layer}."
        d = shapes.hidden
        names["qkv"] = [(p + "self_attn.qkv_proj.weight", (shapes.q_rows + 2 * shapes.kv_rows, d))]
        names["gate_up"] = [(p + "mlp.gate_up_proj.weight", (2 * shapes.intermediate, d))]
        return names
