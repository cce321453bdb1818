"""Llama 2/3.x and Mistral: the base layout (Mistral adds its sliding window, read by the base family)."""

from fleetctl.engine.model.families.base import Family


class Llama(Family):
    name = "llama"
    model_types = ("llama",)
    architectures = ("LlamaForCausalLM",)


class Mistral(Family):
    name = "mistral"
    model_types = ("mistral",)
    architectures = ("MistralForCausalLM",)
