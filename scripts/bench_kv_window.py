"""KV bytes per token at a long context with and without dropping the blocks every layer's sliding window has
passed (engine/core/kv_window.py), measured on the engine's pool: a Mistral-shaped random model (its window,
4,096 tokens by default) is prefilled to the context in chunks, decodes a few tokens, and the blocks it then
holds are counted; the same weights without `sliding_window` (global attention, nothing dropped) are the
baseline in the same run. The shape is small so that a CPU runs it; bytes per token scale with
layers x KV heads x head_dim, the ratio does not. With --hybrid-model, also a model whose windowed layers sit
beside global ones (Gemma 3, 5 : 1), grown to the context on its real weights: the bytes it holds with its
windowed layers' K/V in a pool of their own against every layer in every block.

    python scripts/bench_kv_window.py [--context 8192] [--window 4096] [--hybrid-model DIR]
"""

import argparse
import json
import tempfile
from pathlib import Path

import torch

from fleetctl.engine.core.block_allocator import BLOCK_SIZE, blocks_for
from fleetctl.engine.core.engine_settings import EngineConfig, EngineSettings
from fleetctl.engine.core.llm_engine import LLMEngine
from fleetctl.engine.core.sequence import SamplingParams
from fleetctl.tests.support.tiny_model import write_tokenizer

DECODE_TOKENS = 16


def write_mistral(out: Path, window: int | None, context: int) -> Path:
    import transformers

    tok = write_tokenizer(out, max_length=2 * context)
    config = transformers.MistralConfig(vocab_size=tok.get_vocab_size(), hidden_size=64, intermediate_size=128,
                                        num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
                                        head_dim=16, max_position_embeddings=2 * context, sliding_window=window)
    torch.manual_seed(0)
    transformers.MistralForCausalLM(config).save_pretrained(out)
    return out


def held_at(model_dir: Path, context: int, deterministic: bool) -> tuple[int, int, int]:
    """(blocks held, tokens, bytes per block) once one sequence has reached `context` tokens."""
    settings = EngineSettings(dtype="bfloat16", num_kv_blocks=blocks_for(context, BLOCK_SIZE) + 8,
                              max_num_batched_tokens=1024, deterministic=deterministic)
    engine = LLMEngine(EngineConfig(model_dir=model_dir, settings=settings))
    prompt = [(7 * i + 3) % 250 + 3 for i in range(context - DECODE_TOKENS)]
    seq = engine.add_request(prompt, SamplingParams(max_tokens=DECODE_TOKENS + 1, temperature=0.0, ignore_eos=True))
    while seq.num_tokens < context:
        engine.step()
    return engine.kv_cache.allocator.num_used, seq.num_tokens, engine.kv_cache.spec.bytes_per_block


def hybrid_held(model_dir: Path, context: int) -> None:
    """A model with windowed and global layers (Gemma 3) grown to `context` tokens: the pool bytes it holds per
    token with its windowed layers' K/V apart (global layers: every block; windowed: the slots held) against
    every layer in every block (one pool: what it held before the windowed layers had a pool of their own)."""
    settings = EngineSettings(dtype="bfloat16", num_kv_blocks=blocks_for(context, BLOCK_SIZE) + 8,
                              max_num_batched_tokens=1024, max_num_seqs=4)
    engine = LLMEngine(EngineConfig(model_dir=model_dir, settings=settings))
    prompt = [(7 * i + 3) % 250 + 3 for i in range(context - DECODE_TOKENS)]
    seq = engine.add_request(prompt, SamplingParams(max_tokens=DECODE_TOKENS + 1, temperature=0.0, ignore_eos=True))
    peak_slots = 0
    window = engine.kv_cache.allocator.window
    assert window is not None, f"{model_dir.name}: no windowed layers kept apart"
    while seq.num_tokens < context:
        engine.step()
        peak_slots = max(peak_slots, window.num_held)
    spec, blocks = engine.kv_cache.spec, engine.kv_cache.allocator.num_used
    apart = blocks * len(spec.global_layers) * spec.layer_bytes_per_block + \
        window.num_held * len(spec.windowed_layers) * spec.layer_bytes_per_block
    whole = blocks * spec.bytes_per_block
    tokens = seq.num_tokens
    print(f"{model_dir.name}: at {tokens} tokens ({spec.num_layers} layers, {len(spec.global_layers)} global, window "
          f"{engine.kv_window.tokens if engine.kv_window else 0}): {blocks} blocks, {window.num_held} window slots "
          f"held (peak {peak_slots}) = {apart / tokens / 1024:.1f} KiB/token; every layer in every block "
          f"{whole / tokens / 1024:.1f} KiB/token ({apart / whole:.3f}x); pool allocated "
          f"{engine.kv_cache.nbytes / 2**20:.0f} MiB ({window.num_slots} slots)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--context", type=int, default=8192)
    parser.add_argument("--window", type=int, default=4096)
    parser.add_argument("--hybrid-model", type=Path, default=None,
                        help="a model directory with windowed and global layers (Gemma 3), e.g. gemma3-270m's")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        windowed = write_mistral(Path(tmp) / "windowed", args.window, args.context)
        config = json.loads((windowed / "config.json").read_text())
        plain = Path(tmp) / "global"
        plain.mkdir()
        for item in windowed.iterdir():
            (plain / item.name).symlink_to(item)
        (plain / "config.json").unlink()
        (plain / "config.json").write_text(json.dumps({**config, "sliding_window": None}))
        for deterministic in (False, True):
            base_blocks, tokens, block_bytes = held_at(plain, args.context, deterministic)
            blocks, _, _ = held_at(windowed, args.context, deterministic)
            mode = "deterministic" if deterministic else "fast"
            print(f"{mode}: at {tokens} tokens, window {args.window}: {blocks} blocks held = "
                  f"{blocks * block_bytes / tokens:.0f} B/token; without dropping {base_blocks} blocks = "
                  f"{base_blocks * block_bytes / tokens:.0f} B/token ({blocks / base_blocks:.3f}x)")
    if args.hybrid_model:
        hybrid_held(args.hybrid_model, args.context)


if __name__ == "__main__":
    main()
