"""`fleetctl generate`: one-shot generation on an embedded single engine. Its options are the ones the engine's
settings (EngineConfig, EngineSettings) and a request's sampling (SamplingParams) declare."""

import json
import sys
from typing import Any

import typer

from fleetctl.console.cli.common import fail
from fleetctl.console.cli.declared import Options, with_options
from fleetctl.console.cli.models import resolve_model
from fleetctl.engine.core.engine_settings import EngineConfig
from fleetctl.engine.core.sequence import SamplingParams
from fleetctl.options import build

# the node's KV tiers and named sessions outlive a request: a one-shot engine has no use for them
FLEET_ONLY = ("kv_offload_memory", "kv_offload_host_dir", "kv_offload_dir", "kv_offload_gb", "kv_offload_policy",
              "session_ttl")
ONE_SHOT = {"max_tokens": 64, "temperature": 0.0}  # longer and greedy: an API request's defaults are OpenAI's


@with_options(Options(EngineConfig, panel="Engine", exclude=FLEET_ONLY),
              Options(SamplingParams, panel="Sampling", defaults=ONE_SHOT))
def generate(
    options: dict[str, Any],
    prompts: list[str] = typer.Argument(..., help="One or more prompts (several run as one batch); - reads one "
                                                "per line from stdin."),
    chat: bool = typer.Option(False, "--chat", help="Wrap each prompt as a user message (chat template)."),
    as_json: bool = typer.Option(False, "--json", help="One JSON object per prompt, one per line."),
) -> None:
    """Generate text for PROMPT(s) on an embedded engine: one prompt streams as it is written; several run
    as one batch and print one after another, each under its prompt."""
    from fleetctl.engine.core.llm_engine import LLMEngine
    from fleetctl.engine.core.output import result_of

    prompts = read_prompts(prompts)
    params = build(SamplingParams, options)
    engine = LLMEngine(build(EngineConfig, options, model_dir=resolve_model(options["model"])))
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
