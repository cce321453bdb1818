"""What constrained decoding costs, in one engine, same run: decode tokens/s with every token under a JSON
schema's mask vs free decoding (same model, dtype, batch, prompt), at each batch size; and how long the fleet
takes to compile the schemas an agent sends (tool calls in the generic format, response formats), cold (each
grammar new) and cached. Prints ratios, not absolute claims.

    python scripts/bench_structured.py [--model smollm2-135m] [--dtype bfloat16] [--batches 1,16]
"""

import argparse
import statistics
import time

from fleetctl.console.cli.models import resolve_model
from fleetctl.engine.core.engine_settings import EngineConfig, EngineSettings
from fleetctl.engine.core.grammar import Grammars
from fleetctl.engine.core.llm_engine import LLMEngine
from fleetctl.engine.core.sequence import SamplingParams
from fleetctl.engine.server.response_format import json_schema_grammar
from fleetctl.engine.server.tool_formats import ToolFamily
from fleetctl.engine.server.tool_grammars import ToolChoiceMode, tool_grammar

PROMPT = "Write a note about the lighthouse keeper's day, as JSON."
# the note never completes within the bench's tokens: every decoded token is masked
NOTE = {"type": "object", "properties": {"note": {"type": "string", "minLength": 4000}, "n": {"type": "integer"}},
        "required": ["note", "n"], "additionalProperties": False}
CITY = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 40},
                                         "unit": {"enum": ["celsius", "fahrenheit"]}},
        "required": ["city"], "additionalProperties": False}
SEARCH = {"type": "object", "properties": {"query": {"type": "string"}, "limit": {"type": "integer", "minimum": 1,
                                                                                  "maximum": 50},
                                           "filters": {"type": "array", "items": {"type": "object", "properties": {
                                               "field": {"type": "string"}, "op": {"enum": ["eq", "lt", "gt"]},
                                               "value": {"type": ["string", "number"]}}, "required": ["field"]}}},
          "required": ["query"]}
TOOLS = [("get_weather", CITY), ("search_docs", SEARCH), ("run_sql", {"type": "object", "properties": {
    "sql": {"type": "string"}, "timeout_s": {"type": "number"}}, "required": ["sql"]})]


def decode_tokens_per_s(engine: LLMEngine, batch: int, new_tokens: int, grammar: str | None, repeats: int) -> float:
    def run(n: int) -> float:
        params = SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True, grammar=grammar)
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            engine.generate([PROMPT] * batch, params)
            times.append(time.perf_counter() - start)
        return min(times)

    run(2)
    return batch * (new_tokens - 1) / (run(new_tokens) - run(1))


def schemas() -> list[str]:
    """The grammars of an agent's requests: each tool choice over the tools, and response formats."""
    grammars = [tool_grammar(ToolFamily.GENERIC, TOOLS[:k], mode, parallel, lambda text: text)
                for k in (1, 2, 3) for mode in (ToolChoiceMode.AUTO, ToolChoiceMode.REQUIRED)
                for parallel in (True, False)]
    grammars += [json_schema_grammar(schema) for schema in (NOTE, CITY, SEARCH, {"type": "object"})]
    return [g for g in grammars if g is not None]


def compile_ms(engine: LLMEngine) -> tuple[list[float], list[float]]:
    """(cold, cached) milliseconds per grammar, on a fresh Grammars (the controller's), its tokenizer built first."""
    grammars = Grammars(engine.tokenizer, engine.model_config.vocab_size)
    start = time.perf_counter()
    grammars.ll_tokenizer  # noqa: B018 - built once per process (reported apart)
    print(f"matcher tokenizer built in {1e3 * (time.perf_counter() - start):.0f} ms (once per process)")
    cold, cached = [], []
    for grammar in schemas():
        for into in (cold, cached):
            start = time.perf_counter()
            grammars.compile(grammar)
            into.append(1e3 * (time.perf_counter() - start))
    return cold, cached


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--batches", default="1,16")
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    engine = LLMEngine(EngineConfig(resolve_model(args.model), settings=EngineSettings(dtype=args.dtype)))
    grammar = json_schema_grammar(NOTE)
    print(f"{args.model} {args.dtype}, {args.tokens} tokens, best of {args.repeats}")
    print("| batch | free tok/s | constrained tok/s | constrained / free |")
    print("|---|---|---|---|")
    for batch in (int(b) for b in args.batches.split(",")):
        free = decode_tokens_per_s(engine, batch, args.tokens, None, args.repeats)
        held = decode_tokens_per_s(engine, batch, args.tokens, grammar, args.repeats)
        print(f"| {batch} | {free:.1f} | {held:.1f} | {held / free:.3f} |")
    cold, cached = compile_ms(engine)
    print(f"compile over {len(cold)} grammars: cold p50 {statistics.median(cold):.1f} ms, p99 "
          f"{percentile(cold, 0.99):.1f} ms, max {max(cold):.1f} ms; cached p50 {statistics.median(cached):.3f} ms, "
          f"max {max(cached):.3f} ms")


if __name__ == "__main__":
    main()
