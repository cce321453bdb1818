"""`fleetctl generate`: one-shot generation on an embedded single engine."""

import json
import sys

import typer

from fleetctl.console.cli.common import QUANT_GROUP_OPTION, QUANTIZATION_OPTION, fail
from fleetctl.console.cli.models import resolve_model
from fleetctl.domain import Quantization
from fleetctl.engine.core.engine_settings import CompileMode, DType
from fleetctl.engine.model.registry import DEFAULT_MODEL


def default_device() -> str:
    from fleetctl.engine.core.local_devices import gpu_count

    return "cuda:0" if gpu_count() else "cpu"


def generate(
    prompts: list[str] = typer.Argument(..., help="One or more prompts (several run as one batch); - reads one "
                                                "per line from stdin."),
    model: str = typer.Option(DEFAULT_MODEL, "--model", "-m", help="Store name or Hugging Face directory."),
    max_tokens: int = typer.Option(64, "--max-tokens", "-n", help="New tokens per prompt, at most."),
    temperature: float = typer.Option(0.0, "--temperature", "-t", help="0 is greedy."),
    top_p: float = typer.Option(1.0, "--top-p"),
    top_k: int = typer.Option(0, "--top-k", help="0 disables top-k."),
    seed: int | None = typer.Option(None, "--seed", help="Per-request seed: sampled output is reproducible."),
    stop: list[str] = typer.Option([], "--stop", help="Stop string (repeatable)."),
    ignore_eos: bool = typer.Option(False, "--ignore-eos", help="Keep generating past EOS (benchmarks, tests)."),
    chat: bool = typer.Option(False, "--chat", help="Wrap each prompt as a user message (chat template)."),
    dtype: DType = typer.Option(DType.AUTO, "--dtype", help="auto: bf16 on GPUs and CPUs with native bf16, else fp32."),
    quantization: Quantization = QUANTIZATION_OPTION,
    quant_group_size: int = QUANT_GROUP_OPTION,
    device: str = typer.Option("", "--device", help="cpu or cuda:N (default: cuda:0 if present, else cpu)."),
    deterministic: bool = typer.Option(
        False, "--deterministic", help="Batch-invariant numerics: each output independent of its batch."
    ),
    prefix_cache: bool = typer.Option(
        True, "--prefix-cache/--no-prefix-cache", help="Reuse the KV of prompt prefixes already computed."
    ),
    compile_mode: CompileMode = typer.Option(
        CompileMode.OFF, "--compile", help="on: the decode step compiled for each batch bucket it meets."),
    as_json: bool = typer.Option(False, "--json", help="One JSON object per prompt, one per line."),
) -> None:
    """Generate text for PROMPT(s) on an embedded engine: one prompt streams as it is written; several run
    as one batch and print one after another, each under its prompt."""
    from fleetctl.engine.core.engine_settings import EngineConfig, EngineSettings
    from fleetctl.engine.core.llm_engine import LLMEngine
    from fleetctl.engine.core.output import result_of
    from fleetctl.engine.core.sequence import SamplingParams

    prompts = read_prompts(prompts)
    params = SamplingParams(
        max_tokens=max_tokens, temperature=temperature, top_p=top_p, top_k=top_k, seed=seed, stop=tuple(stop),
        ignore_eos=ignore_eos,
    )
    model_dir = resolve_model(model)
    settings = EngineSettings(dtype=dtype, deterministic=deterministic, prefix_cache=prefix_cache,
                              compile=compile_mode, quantization=quantization,
                              quant_group_size=quant_group_size)
    config = EngineConfig(model_dir=model_dir, device=device or default_device(), settings=settings)
    engine = LLMEngine(config)
    texts = [engine.tokenizer.apply_chat_template([{"role": "user", "content": p}]) if chat else p for p in prompts]
    seqs = [engine.add_request(t, params, request_id=f"prompt-{i}") for i, t in enumerate(texts)]
    text_streams = [engine.text_stream(s.request_id) for s in seqs]
    streaming = len(prompts) == 1 and not as_json
    while engine.has_unfinished():
        for out in engine.step():
            if streaming and out.text_delta:
                sys.stdout.write(out.text_delta)
                sys.stdout.flush()
    if streaming:
        sys.stdout.write("\n")
    results = [result_of(seq, text) for seq, text in zip(seqs, text_streams, strict=True)]
    for prompt, result in zip(prompts, results, strict=True):
        if as_json:
            print(json.dumps({
                "text": result.text,
                "token_ids": result.token_ids,
                "finish_reason": result.finish_reason,
                "usage": {"prompt_tokens": result.prompt_tokens, "completion_tokens": len(result.token_ids)},
                "timing": {
                    "load_s": round(engine.load_seconds, 4),
                    "ttft_s": round(result.ttft_s, 4),
                    "decode_tokens_per_s": round(result.decode_tokens_per_s, 2),
                },
            }))
        elif not streaming:
            print(f"--- {prompt[:60]!r} ({result.finish_reason}, {len(result.token_ids)} tokens)")
            print(result.text)
    if not as_json and sys.stderr.isatty():
        tokens = sum(len(r.token_ids) for r in results)
        rate = max(r.decode_tokens_per_s for r in results)
        print(f"[{tokens} tokens · first token {results[0].ttft_s:.2f} s · {rate:.1f} tokens/s per sequence · "
              f"{str(engine.dtype).removeprefix('torch.')} on {engine.device} · load {engine.load_seconds:.2f} s]",
              file=sys.stderr)


def read_prompts(prompts: list[str]) -> list[str]:
    """`-` stands for the prompts on stdin, one per line (blank lines skipped)."""
    expanded = []
    for prompt in prompts:
        expanded += [line for line in sys.stdin.read().splitlines() if line.strip()] if prompt == "-" else [prompt]
    if not expanded:
        raise fail("no prompt given (stdin was empty)")
    return expanded
