"""Reading each family's config.json: the traits a family sets, the variants refused with one clear error
naming the nearest supported family, and the model store accepting every supported family's directory."""

import json
from pathlib import Path

import pytest

from fleetctl.engine.model.families.base import Activation
from fleetctl.engine.model.model_config import SUPPORTED_ARCHITECTURES, ModelConfig, ModelConfigError
from fleetctl.engine.model.model_store import ModelStore, ModelStoreError

SHAPE = {"vocab_size": 100, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 4,
         "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16}


def config(model_type: str, **fields: object) -> ModelConfig:
    return ModelConfig.from_dict({"model_type": model_type, **SHAPE, **fields})


def test_every_family_is_listed_as_supported() -> None:
    assert set(SUPPORTED_ARCHITECTURES) == {"LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM",
                                            "Qwen3ForCausalLM", "Gemma3ForCausalLM", "Phi3ForCausalLM"}


@pytest.mark.parametrize(("model_type", "nearest"), [("qwen3_moe", "qwen3"), ("gemma3", "gemma3"),
                                                     ("mixtral", "mistral"), ("phi", "phi3")])
def test_an_unsupported_model_type_is_refused_naming_the_nearest_family(model_type: str, nearest: str) -> None:
    with pytest.raises(ModelConfigError, match=f"unsupported model type '{model_type}'; the nearest supported "
                                               f"family is {nearest} "):
        config(model_type)


def test_no_model_type_reads_the_architecture_and_defaults_to_llama() -> None:
    raw = {**SHAPE, "architectures": ["Qwen2ForCausalLM"]}
    assert ModelConfig.from_dict(raw).family == "qwen2"
    assert ModelConfig.from_dict(SHAPE).family == "llama"
    with pytest.raises(ModelConfigError, match="'GPT2LMHeadModel'"):
        ModelConfig.from_dict({**SHAPE, "architectures": ["GPT2LMHeadModel"]})


def test_qwen2_has_a_qkv_bias_and_qwen3_a_per_head_qk_norm() -> None:
    assert config("qwen2").attention_bias and not config("qwen3").attention_bias
    assert config("qwen3").traits.qk_norm and not config("qwen2").traits.qk_norm


@pytest.mark.parametrize(("fields", "windows"), [
    ({"sliding_window": 32}, (32, 32, 32, 32)),  # Mistral: every layer
    ({"sliding_window": None}, ()),
])
def test_mistral_reads_its_window_on_every_layer(fields: dict, windows: tuple) -> None:
    assert config("mistral", **fields).traits.layer_windows == windows


@pytest.mark.parametrize(("fields", "windows"), [
    ({"sliding_window": 32, "use_sliding_window": False}, ()),
    ({"sliding_window": 32, "use_sliding_window": True, "max_window_layers": 2}, (None, None, 32, 32)),
    ({"sliding_window": 32, "use_sliding_window": True,
      "layer_types": ["full_attention", "sliding_attention", "full_attention", "sliding_attention"]},
     (None, 32, None, 32)),
])
def test_qwen_windows_only_with_use_sliding_window_from_max_window_layers_on(fields: dict, windows: tuple) -> None:
    assert config("qwen2", **fields).traits.layer_windows == windows


def test_gemma3_traits_and_its_two_ropes() -> None:
    gemma = config("gemma3_text", sliding_window=512, query_pre_attn_scalar=256,
                   rope_parameters={"sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                                    "full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1e6}})
    traits = gemma.traits
    assert traits.activation is Activation.GELU_TANH and traits.norm_offset == 1.0 and traits.qk_norm
    assert traits.scale_embedding and traits.query_scale == 256**-0.5
    assert traits.layer_windows == (512,) * 4  # every 6th layer is global: none of the first four
    assert (gemma.rope_theta, traits.local_rope_theta) == (1e6, 10000.0)
    assert dict(gemma.rope_scaling) == {"rope_type": "linear", "factor": 8.0}


def test_gemma3_from_a_pre_transformers_5_config() -> None:
    gemma = config("gemma3_text", num_hidden_layers=12, rope_theta=1e6, rope_local_base_freq=1e4,
                   sliding_window=512, sliding_window_pattern=6)
    assert gemma.traits.layer_windows == (512,) * 5 + (None,) + (512,) * 5 + (None,)
    assert (gemma.rope_theta, gemma.traits.local_rope_theta) == (1e6, 1e4)


def test_attention_soft_capping_is_refused() -> None:
    with pytest.raises(ModelConfigError, match="attn_logit_softcapping"):
        config("gemma3_text", attn_logit_softcapping=50.0)


def test_phi3_partial_rotary_and_longrope_context() -> None:
    phi = config("phi3", max_position_embeddings=131072, original_max_position_embeddings=4096,
                 rope_parameters={"rope_type": "longrope", "rope_theta": 10000.0, "partial_rotary_factor": 0.75,
                                  "short_factor": [1.0] * 6, "long_factor": [2.0] * 6})
    assert phi.rotary_dim == 12
    assert phi.max_context == 131072
    assert not phi.long_rope(4096) and phi.long_rope(4097)  # the long factors once past the original length
    assert not config("llama").long_rope(1 << 20)
    assert config("phi3", partial_rotary_factor=0.5).rotary_dim == 8  # the older top-level field


def test_an_odd_rotary_dim_is_refused() -> None:
    with pytest.raises(ModelConfigError, match="rotated part of head_dim must be even"):
        config("phi3", partial_rotary_factor=0.5625)  # 9 of 16 dims


def test_layer_types_of_the_wrong_length_are_refused() -> None:
    with pytest.raises(ModelConfigError, match="layer_types names 2 layers, the model has 4"):
        config("gemma3_text", layer_types=["sliding_attention", "full_attention"])


def test_the_store_accepts_every_family_and_refuses_the_rest(family_model_dirs: dict[str, Path],
                                                             tmp_path: Path) -> None:
    store = ModelStore(tmp_path / "store")
    for model_dir in family_model_dirs.values():
        assert store.resolve(str(model_dir)) == model_dir
    other = tmp_path / "gpt2"
    other.mkdir()
    (other / "tokenizer.json").write_text("{}")
    (other / "config.json").write_text(json.dumps({"model_type": "gpt2"}))
    with pytest.raises(ModelStoreError, match="unsupported model type 'gpt2'; the nearest supported family"):
        store.resolve(str(other))
