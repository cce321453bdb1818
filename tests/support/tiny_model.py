"""Writes a tiny random Llama as a normal Hugging Face directory, with a small real byte-level BPE
tokenizer trained on a fixed text, so the engine's loader, tokenizer and chat template all run; or, with
SMOLLM2_135M's shape, a random model as big as the default one (the GPU check's, where no weights can be carried)."""

import json
from pathlib import Path

import torch
from safetensors.torch import save_file
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CHAT_TEMPLATE = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' + message['content'] "
    "+ '<|im_end|>' + '\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
CORPUS = [
    "The quick brown fox jumps over the lazy dog. " * 4,
    "Prefill reads the prompt in one pass; decode writes the answer a token at a time.",
    "def add(a, b):\n    return a + b\n",
    "Numbers 0 1 2 3 4 5 6 7 8 9 and symbols !?.,;:()[]{} appear here too.",
    "Once upon a time there was a small model that served many requests on one node.",
]
TINY_CONFIG = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 3,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "rms_norm_eps": 1e-5,
    "rope_theta": 10000.0,
    "max_position_embeddings": 512,
    "tie_word_embeddings": False,
    "bos_token_id": 1,
    "eos_token_id": 2,
    "torch_dtype": "float32",
}
# smollm2-135m's config.json (the default model, as `make install` stores it), random weights in its shape. Its
# 49152-token vocabulary is beyond what the tokenizer learns from CORPUS (a few hundred tokens): the embedding
# (tied, so also the LM head) keeps all 49152 rows, so every matmul and the logits are smollm2's size, but the rows
# past the tokenizer's vocabulary are zeros: their logits are 0, far below the best real token's, so greedy
# decoding only ever picks a token the tokenizer can write out.
SMOLLM2_135M = {
    "vocab_size": 49152,
    "hidden_size": 576,
    "intermediate_size": 1536,
    "num_hidden_layers": 30,
    "num_attention_heads": 9,
    "num_key_value_heads": 3,
    "head_dim": 64,
    "rms_norm_eps": 1e-5,
    "rope_theta": 100000.0,
    "max_position_embeddings": 8192,
    "tie_word_embeddings": True,
}


def _tokenizer(vocab_size: int) -> Tokenizer:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(CORPUS, trainer=trainer)
    return tok


def write_tokenizer(out_dir: Path, vocab_size: int = 384, max_length: int = 512) -> Tokenizer:
    """tokenizer.json and tokenizer_config.json (with the chat template) into `out_dir`; returns the tokenizer."""
    out_dir.mkdir(parents=True, exist_ok=True)
    tok = _tokenizer(vocab_size)
    tok.save(str(out_dir / "tokenizer.json"))
    (out_dir / "tokenizer_config.json").write_text(
        json.dumps(
            {
                "bos_token": "<|im_start|>",
                "eos_token": "<|im_end|>",
                "add_bos_token": False,
                "chat_template": CHAT_TEMPLATE,
                "model_max_length": max_length,
                "tokenizer_class": "PreTrainedTokenizerFast",
            }
        )
    )
    return tok


def write_tiny_llama(out_dir: Path, seed: int = 0, tokenizer_vocab: int = 384, **shape: float) -> Path:
    """`shape` overrides config fields (hidden_size, num_hidden_layers, …; SMOLLM2_135M: all of them) for a
    bigger test model. A `vocab_size` in it beyond the tokenizer's (`tokenizer_vocab` at most) pads the embedding
    with zero rows (see SMOLLM2_135M)."""
    tok = write_tokenizer(out_dir, tokenizer_vocab, int(shape.get("max_position_embeddings", 512)))
    config = {**TINY_CONFIG, "vocab_size": tok.get_vocab_size(), **shape}
    if config["vocab_size"] < tok.get_vocab_size():
        raise ValueError(f"vocab_size {config['vocab_size']} is below the tokenizer's {tok.get_vocab_size()}")
    (out_dir / "config.json").write_text(json.dumps(config, indent=2))
    gen = torch.Generator().manual_seed(seed)
    d, inter, vocab = config["hidden_size"], config["intermediate_size"], config["vocab_size"]
    q_rows = config["num_attention_heads"] * config["head_dim"]
    kv_rows = config["num_key_value_heads"] * config["head_dim"]

    def rand(*shape: int, std: float = 0.15) -> torch.Tensor:
        return torch.randn(*shape, generator=gen) * std

    def vocabulary_rows(std: float) -> torch.Tensor:
        rows = rand(vocab, d, std=std)
        rows[tok.get_vocab_size():] = 0  # rows no token of the tokenizer has
        return rows

    tensors = {"model.embed_tokens.weight": vocabulary_rows(1.0), "model.norm.weight": 1 + rand(d, std=0.1)}
    if not config["tie_word_embeddings"]:
        tensors["lm_head.weight"] = vocabulary_rows(0.3)
    for i in range(config["num_hidden_layers"]):
        p = f"model.layers.{i}."
        tensors |= {
            p + "input_layernorm.weight": 1 + rand(d, std=0.1),
            p + "post_attention_layernorm.weight": 1 + rand(d, std=0.1),
            p + "self_attn.q_proj.weight": rand(q_rows, d),
            p + "self_attn.k_proj.weight": rand(kv_rows, d),
            p + "self_attn.v_proj.weight": rand(kv_rows, d),
            p + "self_attn.o_proj.weight": rand(d, q_rows),
            p + "mlp.gate_proj.weight": rand(inter, d),
            p + "mlp.up_proj.weight": rand(inter, d),
            p + "mlp.down_proj.weight": rand(d, inter),
        }
    save_file(tensors, str(out_dir / "model.safetensors"), metadata={"format": "pt"})
    return out_dir
