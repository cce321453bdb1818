"""Where `serve --local-prefill-tokens` comes from: the uncached prompt length at which a decode worker's own
prefill stops being cheaper than the KV handoff from the prefill pool.

A turn of a conversation whose decode worker caches all but L of its tokens can go two ways:
- local: the decode worker runs a prefill step of L tokens; its decode batch waits that long;
- remote: the prefill pool computes the same L tokens (on another device), publishes the sequence's
  whole KV, and the decode worker fetches it and copies the blocks it lacks; the request's second
  token waits for that handoff, and the decode batch for the fetch and copy.
Local is the better deal while its step costs the decode worker no more than the handoff costs the
request: t_local_prefill(L) <= t_handoff(P + L). The crossover is the largest L where that holds.

Both sides are measured in one process, same model, dtype and threads (a CPU slot of a fleet), after a
shared prefix of P tokens is cached on both engines, while the decode engine holds a batch of B
decoding sequences (the prefill step then runs as it would on a busy decode worker). Each time is the
median of --repeats. The controller's two pipe messages of a handoff (~0.1 ms each) are left out, which
favours the remote side.

    python scripts/local_prefill_crossover.py [--model smollm2-135m] [--threads 1] [--prefix 1536] [--batch 8]
"""

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import torch

from fleetctl.console.models_cmd import resolve_model
from fleetctl.engine.core.config import EngineConfig, EngineSettings
from fleetctl.engine.core.llm_engine import LLMEngine
from fleetctl.engine.core.sequence import SamplingParams
from fleetctl.engine.worker.kv_transport import KVTransport, timed_fetch

LENGTHS = (16, 32, 64, 128, 256, 512, 1024)
DECODE = SamplingParams(max_tokens=4096, temperature=0.0, ignore_eos=True)
ONE = SamplingParams(max_tokens=2, temperature=0.0, ignore_eos=True)


def tokens(n: int, salt: int, vocab: int) -> list[int]:
    return [(7919 * i + 104729 * salt) % (vocab - 100) + 50 for i in range(n)]


def local_prefill_s(engine: LLMEngine, prompt: list[int], rid: str) -> float:
    """One prefill step of `prompt` on `engine` (its cached prefix reused), beside its decoding batch."""
    engine.add_request(prompt, ONE, request_id=rid)
    engine.step()
    seconds = engine.last_step.seconds
    engine.release(rid)
    return seconds


def handoff_s(prefill: LLMEngine, decode: LLMEngine, transport: KVTransport, prompt: list[int], rid: str) -> float:
    """Publish `prompt`'s KV from the prefill engine, fetch and adopt it on the decode engine."""
    prefill.add_request(prompt, ONE, request_id=rid)
    prefill.step()
    start = time.perf_counter()
    handle = transport.publish(prefill.export_kv(rid))
    seconds = time.perf_counter() - start
    kv, fetch = timed_fetch(transport, handle, decode.device)
    start = time.perf_counter()
    seq = prefill.sequence(rid)
    decode.import_sequence(rid, seq.prompt_token_ids, seq.output_token_ids, ONE, seq.seed, kv)
    seconds += fetch + time.perf_counter() - start
    transport.release(handle)
    prefill.release(rid)
    decode.release(rid)
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--prefix", type=int, default=1536, help="cached tokens before the uncached part")
    parser.add_argument("--batch", type=int, default=8, help="sequences decoding on the decode engine")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    model = resolve_model(args.model)
    settings = EngineSettings(dtype=args.dtype, num_kv_blocks=512)
    decode = LLMEngine(EngineConfig(model, settings=settings, detokenize=False))
    prefill = LLMEngine(EngineConfig(model, settings=settings, detokenize=False, prefill_only=True))
    vocab = decode.model_config.vocab_size
    prefix = tokens(args.prefix, 0, vocab)
    for engine in (decode, prefill):  # the shared prefix, cached on both
        engine.generate([prefix], ONE)
    for i in range(args.batch):
        decode.add_request(prefix + tokens(64, 100 + i, vocab), DECODE, request_id=f"batch-{i}")
    for _ in range(3):
        decode.step()  # the batch prefilled and decoding
    decode_step = statistics.median(_decode_step(decode) for _ in range(5))
    print(f"{args.model} {decode.dtype} on {args.threads} thread(s); cached prefix {args.prefix} tokens; decode batch "
          f"{args.batch}: one decode step {decode_step * 1e3:.1f} ms")
    print(f"{'uncached L':>10} {'local prefill':>14} {'handoff':>10} {'cheaper':>8}")
    crossover = 0
    with tempfile.TemporaryDirectory(dir="/dev/shm") as shm:
        transport = KVTransport(Path(shm), fleet_pid=0)
        for n, length in enumerate(LENGTHS):
            local = statistics.median(local_prefill_s(decode, prefix + tokens(length, 1000 + n * 10 + r, vocab),
                                                      f"l{n}-{r}") for r in range(args.repeats))
            remote = statistics.median(handoff_s(prefill, decode, transport,
                                                 prefix + tokens(length, 5000 + n * 10 + r, vocab), f"h{n}-{r}")
                                       for r in range(args.repeats))
            cheaper = "local" if local <= remote else "handoff"
            crossover = length if local <= remote else crossover
            print(f"{length:>10} {local * 1e3:>11.1f} ms {remote * 1e3:>7.1f} ms {cheaper:>8}")
    print(f"crossover: local prefill is cheaper up to {crossover} uncached tokens (of those measured)")


def _decode_step(engine: LLMEngine) -> float:
    engine.step()
    return engine.last_step.seconds


if __name__ == "__main__":
    main()
