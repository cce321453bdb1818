"""Qwen2/2.5 (a bias on the q/k/v projections) and Qwen3 dense (no bias, RMSNorm over each head of q and k)."""

from dataclasses import replace

from fleetctl.engine.model.families.base import Family, Traits


class Qwen2(Family):
    name = "qwen2"
    model_types = ("qwen2",)
    architectures = ("Qwen2ForCausalLM",)
    qkv_bias = True


class Qwen3(Family):
    name = "qwen3"
    model_types = ("qwen3",)
    architectures = ("Qwen3ForCausalLM",)

    def traits(self, raw: dict, num_layers: int) -> Traits:
        return replace(super().traits(raw, num_layers), qk_norm=True)
