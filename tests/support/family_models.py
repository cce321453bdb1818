"""Tiny random models of each supported family, built by transformers itself (its config class from a dict,
its model class's random weights, its save_pretrained) with the small real tokenizer of tiny_model, so a test
compares fleetctl with transformers on a directory transformers wrote. No hub: nothing is downloaded."""

from pathlib import Path

import torch

from fleetctl.tests.support.tiny_model import write_tokenizer

_SHAPE = {
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "max_position_embeddings": 512,
    "rms_norm_eps": 1e-5,
    "bos_token_id": 1,
    "eos_token_id": 2,
    "pad_token_id": 0,
    "tie_word_embeddings": False,
}
WINDOW = 24  # the windowed families' sliding window: prompts in the tests run past it
# per family: the model_type and what its config sets beyond _SHAPE (the variant each exercises)
FAMILY_CONFIGS: dict[str, tuple[str, dict]] = {
    "llama3": ("llama", {"rope_parameters": {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0,
                                             "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                             "original_max_position_embeddings": 64}}),
    "mistral": ("mistral", {"sliding_window": WINDOW, "rope_parameters": {"rope_type": "default",
                                                                         "rope_theta": 1000000.0}}),
    "qwen2": ("qwen2", {"rope_parameters": {"rope_type": "default", "rope_theta": 1000000.0}}),
    "qwen3": ("qwen3", {"rope_parameters": {"rope_type": "yarn", "rope_theta": 1000000.0, "factor": 4.0,
                                            "original_max_position_embeddings": 128}}),
    "gemma3": ("gemma3_text", {"sliding_window": WINDOW, "query_pre_attn_scalar": 24, "tie_word_embeddings": True,
                               "layer_types": ["sliding_attention", "sliding_attention", "full_attention",
                                               "sliding_attention"],
                               "rope_parameters": {"sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                                                   "full_attention": {"rope_type": "linear", "factor": 2.0,
                                                                      "rope_theta": 1000000.0}}}),
    # trained to 16 positions: every prompt of the tests runs past it, so they check longrope's long factors
    "phi3": ("phi3", {"original_max_position_embeddings": 16,
                      "rope_parameters": {"rope_type": "longrope", "rope_theta": 10000.0, "partial_rotary_factor": 0.75,
                                          "short_factor": [1.0 + 0.1 * i for i in range(6)],
                                          "long_factor": [2.0 + 0.5 * i for i in range(6)]}}),
}


def write_family_model(family: str, out_dir: Path, seed: int = 0, **overrides: object) -> Path:
    """A tiny random `family` model (a key of FAMILY_CONFIGS, its config fields updated by `overrides`) saved by
    transformers into `out_dir`."""
    import transformers

    model_type, fields = FAMILY_CONFIGS[family]
    tok = write_tokenizer(out_dir, max_length=_SHAPE["max_position_embeddings"])
    config = transformers.AutoConfig.for_model(model_type, vocab_size=tok.get_vocab_size(),
                                               **{**_SHAPE, **fields, **overrides})
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():  # weights with clear greedy margins (transformers' init, std 0.02, gives near-ties)
        for name, param in model.named_parameters():
            noise = torch.randn(param.shape, generator=gen)
            if "norm" in name:  # Gemma stores w - 1 (its norms scale by 1 + w), the others w
                param.copy_(noise * 0.1 + (0.0 if model_type == "gemma3_text" else 1.0))
            elif "embed_tokens" in name:
                param.copy_(noise)
            else:
                param.copy_(noise * (0.3 if "lm_head" in name else 0.15))
    model.save_pretrained(out_dir)
    return out_dir


def load_reference(model_dir: Path) -> "torch.nn.Module":
    """The same directory loaded by transformers, float32, eager attention (its sliding windows applied)."""
    import transformers

    return transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32,
                                                             attn_implementation="eager").eval()


def reference_greedy(model_dir: Path, ids: list[int], steps: int) -> list[int]:
    """The `steps` tokens transformers' greedy decode makes after `ids` (EOS ignored)."""
    with torch.no_grad():
        out = load_reference(model_dir).generate(torch.tensor([ids]), max_new_tokens=steps, min_new_tokens=steps,
                                                 do_sample=False, eos_token_id=None)
    return out[0, len(ids):].tolist()
