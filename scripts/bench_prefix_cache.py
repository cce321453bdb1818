"""What prefix caching saves an agent: one 6-turn conversation (a ~1,500-token system prompt with tool
descriptions; each turn appends a ~150-token tool result and generates 60 tokens) on one engine with
the cache on and one with it off, same model, same dtype, same run, the two turn by turn in
alternation so that both see the same machine. Per turn: prompt tokens computed, TTFT, and the
prefix hit ratio; then the totals and the share of model time spent decoding. With --repeats N the
conversation runs N times on fresh engines and each turn's TTFT is the fastest of the N (a shared
machine only ever adds time; there, --threads 1 also gives steadier numbers, as oversubscribed
OpenMP threads spin).

    python scripts/bench_prefix_cache.py [--model smollm2-135m] [--dtype bfloat16] [--device cpu] [--threads 2]
                                         [--repeats 1]

Turn k+1's prompt is turn k's prompt + its answer + the new tool turn, as token ids (an agent loop that
keeps its token history): the answer's K/V were written while decoding, so they are reused too.
"""

import argparse
import random
from dataclasses import dataclass
from pathlib import Path

import torch

from fleetctl.console.cli.models import resolve_model
from fleetctl.console.loadgen.requests import WORDS
from fleetctl.domain import Phase
from fleetctl.engine.core.engine_settings import EngineConfig, EngineSettings
from fleetctl.engine.core.llm_engine import LLMEngine
from fleetctl.engine.core.sequence import SamplingParams

TURNS = 6
SYSTEM_TOKENS = 1500
TOOL_TOKENS = 150
ANSWER_TOKENS = 60
TOOLS = ("search", "read_file", "run_tests", "edit_file", "list_dir", "http_get", "query_db", "summarize")


@dataclass(frozen=True)
class Turn:
    prompt_tokens: int
    cached: int  # prompt tokens served from the prefix cache
    computed: int  # prompt tokens run through the model
    ttft_s: float
    prefill_s: float  # model time of the steps in the turn, by phase
    decode_s: float


def words(rng: random.Random, count: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(count))


def text_of(engine: LLMEngine, rng: random.Random, tokens: int, head: str) -> list[int]:
    """`head` then random words, cut to exactly `tokens` tokens."""
    ids = engine.tokenizer.encode(head + words(rng, tokens))
    return ids[:tokens]


def conversation(engine: LLMEngine, seed: int = 0) -> tuple[list[int], list[list[int]]]:
    """The system prompt's token ids and each turn's new tokens (a tool result in chat markup)."""
    rng = random.Random(seed)
    tools = "".join(f"\n- {name}: {words(rng, 40)}" for name in TOOLS)
    system = text_of(engine, rng, SYSTEM_TOKENS, f"<|im_start|>system\nYou are an agent. Tools:{tools}\n")
    turns = []
    for i in range(TURNS):
        result = text_of(engine, rng, TOOL_TOKENS - 12, f"result of {TOOLS[i % len(TOOLS)]}: ")
        head = engine.tokenizer.encode("<|im_end|>\n<|im_start|>tool\n")
        tail = engine.tokenizer.encode("<|im_end|>\n<|im_start|>assistant\n")
        turns.append(head + result + tail)
    return system, turns


def run_turn(engine: LLMEngine, prompt: list[int], request_id: str) -> tuple[Turn, list[int]]:
    params = SamplingParams(max_tokens=ANSWER_TOKENS, temperature=0.0, ignore_eos=True)
    seq = engine.add_request(prompt, params, request_id=request_id)
    seconds = {Phase.PREFILL: 0.0, Phase.DECODE: 0.0}
    cached = computed = 0
    while engine.has_unfinished():
        engine.step()
        stats = engine.last_step
        seconds[stats.phase] += stats.seconds
        if stats.phase is Phase.PREFILL:
            cached, computed = stats.cached_tokens[0], stats.new_tokens[0]
    ttft = seq.first_token_time - seq.arrival_time
    turn = Turn(len(prompt), cached, computed, ttft, seconds[Phase.PREFILL], seconds[Phase.DECODE])
    return turn, seq.output_token_ids


def run_conversation(model_dir: Path, args: argparse.Namespace) -> tuple[dict[bool, list[Turn]], torch.dtype]:
    """Both engines through the same turns, turn by turn in alternation."""
    engines = {
        cache: LLMEngine(EngineConfig(model_dir, device=args.device, settings=EngineSettings(
            dtype=args.dtype, prefix_cache=cache, kv_memory_bytes=1 << 30)))
        for cache in (False, True)
    }
    system, turns = conversation(engines[True])
    for cache, engine in engines.items():  # warm-up: a short unrelated request
        run_turn(engine, engine.tokenizer.encode("warm up " * 20), f"warm-{cache}")
    prompts = {cache: list(system) for cache in engines}
    results: dict[bool, list[Turn]] = {False: [], True: []}
    for i, new in enumerate(turns):
        for cache, engine in engines.items():
            prompts[cache] += new
            turn, answer = run_turn(engine, prompts[cache], f"turn-{i + 1}")
            results[cache].append(turn)
            prompts[cache] += answer
    return results, engines[True].dtype


def fastest(runs: list[list[Turn]]) -> list[Turn]:
    return [min(turns, key=lambda t: t.ttft_s) for turns in zip(*runs, strict=True)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--repeats", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    model_dir = resolve_model(args.model)
    runs = [run_conversation(model_dir, args) for _ in range(args.repeats)]
    off, on = (fastest([results[cache] for results, _ in runs]) for cache in (False, True))
    print(f"{args.model} {runs[0][1]} {args.device} threads={args.threads} repeats={args.repeats}: {TURNS} turns, "
          f"system {SYSTEM_TOKENS} tokens, +{TOOL_TOKENS} per turn, {ANSWER_TOKENS} generated per turn")
    print(f"{'turn':>4} {'prompt':>6} {'off comp':>8} {'on comp':>8} {'on hit':>7} {'comp on/off':>11} "
          f"{'off TTFT ms':>11} {'on TTFT ms':>10} {'TTFT off/on':>11}")
    for i, (a, b) in enumerate(zip(off, on, strict=True)):
        print(f"{i + 1:>4} {b.prompt_tokens:>6} {a.computed:>8} {b.computed:>8} {b.cached / b.prompt_tokens:>7.1%} "
              f"{b.computed / a.computed:>11.3f} {a.ttft_s * 1e3:>11.1f} {b.ttft_s * 1e3:>10.1f} "
              f"{a.ttft_s / b.ttft_s:>11.2f}")
    for label, first in (("all turns", 0), ("turns 2-6", 1)):
        prompt = sum(t.prompt_tokens for t in on[first:])
        hit = sum(t.cached for t in on[first:])
        comp_off, comp_on = sum(t.computed for t in off[first:]), sum(t.computed for t in on[first:])
        ttft_off, ttft_on = sum(t.ttft_s for t in off[first:]), sum(t.ttft_s for t in on[first:])
        print(f"{label}: hit ratio {hit / prompt:.1%} ({hit}/{prompt} prompt tokens); prefill tokens computed "
              f"{comp_on} vs {comp_off} (on/off {comp_on / comp_off:.3f}); TTFT total {ttft_on * 1e3:.0f} ms vs "
              f"{ttft_off * 1e3:.0f} ms (off/on {ttft_off / ttft_on:.2f}x)")
    for cache, turns_of in ((False, off), (True, on)):
        prefill, decode = sum(t.prefill_s for t in turns_of), sum(t.decode_s for t in turns_of)
        print(f"cache {'on ' if cache else 'off'}: model time prefill {prefill:.2f} s, decode {decode:.2f} s, "
              f"decode share {decode / (prefill + decode):.1%}")


if __name__ == "__main__":
    main()
