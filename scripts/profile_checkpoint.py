"""Where a worker's checkpoint write spends its time, and what makes it slower inside a migration.

    python scripts/profile_checkpoint.py [--model smollm2-135m] [--sessions 16] [--tokens 510] [--repeats 3]

One engine in this process (the model's real KV layout, the pool sized as a worker sizes it), `--sessions`
sequences of `--tokens` tokens holding blocks filled with random K/V, checkpointed with the worker's own
code (`write_engine_checkpoint`: snapshot, fork, the forked writer's safetensors + sha256 + fsync) under
the conditions a migration adds, each timed against the quiet baseline in the same run:

- quiet: nothing else runs;
- cpu: two busy processes (the prefill worker and the standby on this machine's two cores);
- dirty: another process has just written (not synced) 512 MiB to the same file system, as the page cache
  holds after a standby's first start (ext4's journal commit on fsync may have to write it first);
- cow: the pool is written by the parent right after the fork (copy-on-write faults), as a worker that
  kept decoding would.

Also: the fork alone (page tables of a process holding the weights and the pool) and the writer's parts
(the data file with its hash, each fsync) timed in this process without a fork.
"""

import argparse
import multiprocessing
import os
import statistics
import tempfile
import time
from pathlib import Path

import torch

from fleetctl.console.cli.models import resolve_model
from fleetctl.domain import WorkerRole
from fleetctl.engine.checkpoint import format as checkpoint_format
from fleetctl.engine.checkpoint.engine_io import current_compat, write_engine_checkpoint
from fleetctl.engine.checkpoint.snapshot import payload_of_blocks, snapshot_records
from fleetctl.engine.core.engine_settings import EngineConfig, EngineSettings
from fleetctl.engine.core.llm_engine import LLMEngine
from fleetctl.engine.core.sequence import SamplingParams, Sequence, SequenceStatus


def spin(seconds: float) -> None:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        pass


def dirty(folder: Path, mib: int) -> None:
    with open(folder / "dirty.bin", "wb") as f:
        chunk = os.urandom(1 << 20)
        for _ in range(mib):
            f.write(chunk)


def fill(engine: LLMEngine, sessions: int, tokens: int) -> int:
    """`sessions` running sequences of `tokens` tokens with random K/V in their blocks; returns KV bytes."""
    block_size = engine.kv_cache.spec.block_size
    blocks = -(-tokens // block_size)
    params = SamplingParams(max_tokens=1000)
    for i in range(sessions):
        seq = Sequence(list(range(1, tokens)), params, request_id=f"s{i}", output_token_ids=[7])
        seq.block_table = engine.kv_cache.allocator.allocate(blocks)
        seq.num_cached_tokens = tokens - 1
        seq.status = SequenceStatus.RUNNING
        engine.scheduler.running.append(seq)
        index = torch.tensor(seq.block_table)
        engine.kv_cache.tensor.index_copy_(2, index, torch.randn_like(engine.kv_cache.tensor[:, :, :blocks]))
    return sessions * blocks * engine.kv_cache.spec.bytes_per_block


def timed_checkpoint(engine: LLMEngine, compat, root: Path, name: str, cow: bool) -> tuple[float, float]:
    """(seconds of the whole write, seconds from its start to the forked writer running)."""
    start = time.perf_counter()
    forked: list[float] = []

    def on_writer(pid: int) -> None:
        forked.append(time.perf_counter() - start)
        if cow:  # the parent writes its pool while the child reads its copy-on-write view
            engine.kv_cache.tensor.add_(0.0)

    write_engine_checkpoint(engine, "decode-0", WorkerRole.DECODE, compat, root, name, on_writer)
    return time.perf_counter() - start, forked[0]


def writer_parts(engine: LLMEngine, root: Path) -> dict[str, float]:
    """The writer's own steps, in this process (no fork): data + hash, fsyncs, the rest."""
    records, blocks = snapshot_records(engine)
    payload = payload_of_blocks(engine.kv_cache.tensor, blocks)
    fsyncs: list[float] = []
    real_fsync = os.fsync

    def fsync(fd: int) -> None:
        start = time.perf_counter()
        real_fsync(fd)
        fsyncs.append(time.perf_counter() - start)

    os.fsync = fsync
    try:
        start = time.perf_counter()
        checkpoint_format.write_checkpoint(root, "parts", "decode-0", WorkerRole.DECODE,
                                           current_compat(engine, "cpu"), records, payload)
        total = time.perf_counter() - start
    finally:
        os.fsync = real_fsync
    return {"total": total, "fsync": sum(fsyncs), "fsync_kv": fsyncs[0] if fsyncs else 0.0,
            "data_and_hash": total - sum(fsyncs)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--sessions", type=int, default=16)
    parser.add_argument("--tokens", type=int, default=510)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--dtype", default="auto")
    args = parser.parse_args()
    model_dir = resolve_model(args.model)
    config = EngineConfig(model_dir=model_dir, device="cpu", settings=EngineSettings(dtype=args.dtype))
    engine = LLMEngine(config)
    nbytes = fill(engine, args.sessions, args.tokens)
    compat = current_compat(engine, "cpu")
    rss = int(Path("/proc/self/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    print(f"{args.model} {engine.dtype}: {args.sessions} x {args.tokens} tokens = {nbytes / 2**20:.1f} MiB of KV; "
          f"pool {engine.kv_cache.tensor.numel() * engine.kv_cache.tensor.element_size() / 2**20:.0f} MiB, "
          f"process RSS {rss / 2**20:.0f} MiB")
    with tempfile.TemporaryDirectory(dir=Path.home()) as scratch:
        root = Path(scratch)
        results: dict[str, list[tuple[float, float]]] = {}
        for repeat in range(args.repeats):
            for condition in ("quiet", "cpu", "dirty", "cow"):
                helpers = []
                if condition == "cpu":
                    helpers = [multiprocessing.Process(target=spin, args=(30.0,)) for _ in range(2)]
                elif condition == "dirty":
                    dirty(root, 512)
                for helper in helpers:
                    helper.start()
                results.setdefault(condition, []).append(
                    timed_checkpoint(engine, compat, root, f"{condition}-{repeat}", cow=condition == "cow"))
                for helper in helpers:
                    helper.kill()
                    helper.join()
                (root / "dirty.bin").unlink(missing_ok=True)
        parts = writer_parts(engine, root)
    quiet = statistics.median(total for total, _ in results["quiet"])
    print(f"{'condition':<8} {'write s (median)':>16} {'runs':>24} {'fork s':>8} {'vs quiet':>9}")
    for condition, runs in results.items():
        median = statistics.median(total for total, _ in runs)
        fork = statistics.median(forked for _, forked in runs)
        print(f"{condition:<8} {median:16.3f} {' '.join(f'{t:.3f}' for t, _ in runs):>24} {fork:8.3f} "
              f"{median / quiet:8.2f}x")
    print("writer parts without a fork: " + ", ".join(f"{k} {v:.3f} s" for k, v in parts.items()))


if __name__ == "__main__":
    main()
