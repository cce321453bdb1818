"""Which family runs a config.json: by its `model_type`, else its `architectures`; anything else is refused,
naming the nearest family this engine runs."""

import difflib

from fleetctl.engine.model.families.base import Family, ModelConfigError
from fleetctl.engine.model.families.gemma3 import Gemma3
from fleetctl.engine.model.families.llama import Llama, Mistral
from fleetctl.engine.model.families.phi3 import Phi3
from fleetctl.engine.model.families.qwen import Qwen2, Qwen3

FAMILIES: tuple[Family, ...] = (Llama(), Mistral(), Qwen2(), Qwen3(), Gemma3(), Phi3())
SUPPORTED_ARCHITECTURES = tuple(arch for family in FAMILIES for arch in family.architectures)
_BY_MODEL_TYPE = {model_type: family for family in FAMILIES for model_type in family.model_types}
_BY_ARCHITECTURE = {arch: family for family in FAMILIES for arch in family.architectures}


def family_named(name: str) -> Family:
    """The family a ModelConfig names."""
    return next(family for family in FAMILIES if family.name == name)


def family_for(raw: dict) -> Family:
    """The family for a parsed config.json; raises ModelConfigError naming the nearest supported one."""
    if not isinstance(raw, dict):
        raise ModelConfigError("config.json is not a JSON object")
    model_type = raw.get("model_type")
    architectures = raw.get("architectures") or []
    if model_type in _BY_MODEL_TYPE:
        return _BY_MODEL_TYPE[model_type]
    if model_type is None:
        known = [arch for arch in architectures if arch in _BY_ARCHITECTURE]
        if known or not architectures:
            return _BY_ARCHITECTURE[known[0]] if known else FAMILIES[0]  # no model_type, no architectures: Llama
    asked = str(model_type or architectures[0])
    candidates = list(_BY_MODEL_TYPE) + list(_BY_ARCHITECTURE)
    nearest = difflib.get_close_matches(asked, candidates, n=1, cutoff=0.0)[0]
    family = _BY_MODEL_TYPE.get(nearest) or _BY_ARCHITECTURE[nearest]
    raise ModelConfigError(
        f"unsupported model type {asked!r}; the nearest supported family is {family.name} "
        f"({', '.join(family.architectures)}); supported: {', '.join(SUPPORTED_ARCHITECTURES)}")
