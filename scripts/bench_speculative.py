"""Speculative decoding (`--speculative ngram`) against plain decode, same engine settings, same prompts, same run:
decode tokens/s and TPOT at each batch on three workloads, the drafts' acceptance and the tokens a verifying
sequence gains per step; and llama.cpp on the model's own GGUF at batch 1, plain and with its prompt lookup
(`llama_cpp_lookup.py` in `--llama-python`'s interpreter).

Workloads (chat-templated, greedy):
- agent: a tool-calling turn after a `read_file` call returned a JSON config; the model's answer is a `write_file`
  call whose arguments re-quote that file with one value changed;
- code: a Python module of this repository, to be output whole with a function renamed;
- chat: a short story (little to look up: speculation should stay out of the way).

    python scripts/bench_speculative.py [--model smollm2-135m] [--quantization int4] [--batches 1,4,16]
        [--new-tokens 256] [--speculative-tokens 7] [--llama-python /path/to/venv/bin/python] [--deterministic]
"""

import argparse
import json
import subprocess
import tempfile
import time
from pathlib import Path

import torch

from fleetctl.console.cli.models import resolve_model
from fleetctl.domain import Quantization
from fleetctl.engine.core.engine_settings import EngineConfig, EngineSettings, SpeculativeMode
from fleetctl.engine.core.llm_engine import LLMEngine
from fleetctl.engine.core.node_outputs import NodeOutputs
from fleetctl.engine.core.sequence import SamplingParams
from fleetctl.engine.model.model_store import SOURCE_GGUF

LOOKUP = Path(__file__).with_name("llama_cpp_lookup.py")
MODULE = Path(__file__).parents[1] / "engine" / "core" / "block_allocator.py"
CONFIG = {"service": "inventory", "listen": {"host": "0.0.0.0", "port": 8080}, "timeout_s": 10, "retries": 3,
          "database": {"url": "postgres://inventory@db:5432/inventory", "pool_size": 16, "statement_timeout_ms": 5000},
          "cache": {"backend": "redis", "url": "redis://cache:6379/0", "ttl_s": 300},
          "logging": {"level": "info", "format": "json", "fields": ["time", "level", "message", "request_id"]},
          "features": {"bulk_import": True, "audit_log": True, "soft_delete": False}}
TOOLS = [{"type": "function", "function": {"name": name, "description": text, "parameters": {
    "type": "object", "properties": props, "required": list(props)}}}
    for name, text, props in (
        ("read_file", "Read a file of the project.", {"path": {"type": "string"}}),
        ("write_file", "Write a file of the project, whole.", {"path": {"type": "string"},
                                                               "content": {"type": "string"}}))]


def workloads() -> dict[str, tuple[list[dict], list[dict] | None]]:
    config = json.dumps(CONFIG, indent=2)
    module = MODULE.read_text()[:2400]
    agent = [{"role": "system", "content": "You are a coding agent. Call tools to change files."},
             {"role": "user", "content": "Set the timeout in config.json to 30 seconds."},
             {"role": "assistant", "content": "", "tool_calls": [{"type": "function", "id": "call_1", "function": {
                 "name": "read_file", "arguments": {"path": "config.json"}}}]},
             {"role": "tool", "tool_call_id": "call_1", "name": "read_file", "content": config},
             {"role": "user", "content": "Now write config.json back whole with timeout_s set to 30: output the "
                                         "complete file."}]
    code = [{"role": "user", "content": f"Here is a Python module:\n```python\n{module}\n```\nRename the class "
                                        f"`BlockAllocator` to `BlockPool` and output the whole module."}]
    chat = [{"role": "user", "content": "Write a short story about a lighthouse keeper who finds a message in a "
                                        "bottle."}]
    return {"agent": (agent, TOOLS), "code": (code, None), "chat": (chat, None)}


def run(engine: LLMEngine, prompt: list[int], batch: int, new_tokens: int) -> dict[str, float]:
    """`batch` copies of the prompt decoded together: decode tokens/s (after every sequence's first token), TPOT,
    acceptance, tokens gained per verifying step of a sequence; and the first sequence's tokens. A speculating
    engine starts each run with an empty node-wide outputs file: the runs' identical outputs are not drafted from."""
    if engine.speculator is not None:
        engine.speculator.node = NodeOutputs(Path(tempfile.mkdtemp()) / "outputs.tokens")
    params = SamplingParams(max_tokens=new_tokens, temperature=0.0, ignore_eos=True)
    seqs = [engine.add_request(prompt, params) for _ in range(batch)]
    while any(not seq.output_token_ids for seq in seqs):
        engine.step()
    before = sum(len(seq.output_token_ids) for seq in seqs)
    drafted = kept = verifying = 0
    start = time.perf_counter()
    while engine.has_unfinished():
        engine.step()
        step = engine.last_step
        drafted, kept = drafted + sum(step.drafted), kept + sum(step.accepted)
        verifying += sum(1 for d in step.drafted if d)
    seconds = time.perf_counter() - start
    tokens = sum(len(seq.output_token_ids) for seq in seqs) - before
    return {"tok_s": tokens / seconds, "tpot_ms": 1e3 * seconds / (tokens / batch),
            "acceptance": kept / drafted if drafted else 0.0, "per_step": 1 + kept / verifying if verifying else 1.0,
            "tokens": seqs[0].output_token_ids}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--quantization", default="int4")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--batches", default="1,4,16")
    parser.add_argument("--new-tokens", type=int, default=256)
    parser.add_argument("--speculative-tokens", type=int, default=EngineSettings().speculative_tokens)
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--deterministic", action="store_true")
    parser.add_argument("--llama-python", help="an interpreter with llama-cpp-python: its plain and lookup decode")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    model_dir = resolve_model(args.model)
    batches = [int(b) for b in args.batches.split(",")]

    def engine(mode: SpeculativeMode) -> LLMEngine:
        return LLMEngine(EngineConfig(model_dir, settings=EngineSettings(
            dtype=args.dtype, quantization=Quantization(args.quantization), deterministic=args.deterministic,
            speculative=mode, speculative_tokens=args.speculative_tokens, max_num_seqs=max(batches))))

    engines = {mode: engine(mode) for mode in (SpeculativeMode.NONE, SpeculativeMode.NGRAM)}
    tokenizer = engines[SpeculativeMode.NONE].tokenizer
    prompts = {name: tokenizer.encode(tokenizer.apply_chat_template(messages, tools))
               for name, (messages, tools) in workloads().items()}
    print(f"model {model_dir.name}  {engines[SpeculativeMode.NONE].weights_label}  threads {args.threads}  "
          f"new tokens {args.new_tokens}  draft at most {args.speculative_tokens}"
          f"{'  deterministic' if args.deterministic else ''}")
    print(f"{'workload':<8} {'prompt':>6} {'batch':>5} {'plain tok/s':>11} {'spec tok/s':>10} {'ratio':>6} "
          f"{'TPOT ms':>13} {'accept':>6} {'tok/step':>8} {'same':>5}")
    batch1: dict[str, float] = {}
    for name, prompt in prompts.items():
        for batch in batches:
            plain = run(engines[SpeculativeMode.NONE], prompt, batch, args.new_tokens)
            spec = run(engines[SpeculativeMode.NGRAM], prompt, batch, args.new_tokens)
            if batch == 1:
                batch1[name] = spec["tok_s"]
            print(f"{name:<8} {len(prompt):>6} {batch:>5} {plain['tok_s']:>11.1f} {spec['tok_s']:>10.1f} "
                  f"{spec['tok_s'] / plain['tok_s']:>5.2f}x {plain['tpot_ms']:>6.1f}/{spec['tpot_ms']:<6.1f} "
                  f"{spec['acceptance']:>6.0%} {spec['per_step']:>8.2f} {plain['tokens'] == spec['tokens']!s:>5}")
    if args.llama_python:
        gguf = model_dir / SOURCE_GGUF
        out = subprocess.run([args.llama_python, str(LOOKUP), str(gguf), str(args.threads), str(args.new_tokens),
                              str(args.speculative_tokens), json.dumps(list(prompts.values()))],
                             capture_output=True, text=True, check=True)
        llama = json.loads(out.stdout.splitlines()[-1])
        for i, name in enumerate(prompts):
            plain, lookup = llama["plain"][i], llama["lookup"][i]
            print(f"llama.cpp {name:<6} batch 1: plain {plain:.1f} tok/s, prompt lookup {lookup:.1f} tok/s; "
                  f"fleetctl speculative {batch1.get(name, 0.0):.1f} tok/s = {batch1.get(name, 0.0) / lookup:.2f}x "
                  f"its lookup, {batch1.get(name, 0.0) / plain:.2f}x its plain")


if __name__ == "__main__":
    main()
