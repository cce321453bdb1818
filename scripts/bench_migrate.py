"""Downtime of moving a decode worker that holds 16 streaming sessions, as its clients see it, at several
context lengths: live migration (sessions moved while they decode) vs the checkpoint path (the source
pauses, its state goes through disk to a standby already loaded) vs a cold start (a checkpoint whose
compat does not match: a new process loads the model and re-prefills every session). Goal: live <= 50 ms
at every length, flat as the context grows, >= 100x shorter than a cold start at 512 tokens.

    python scripts/bench_migrate.py [--model smollm2-135m | --test-model] [--sessions 16]
                                    [--contexts 128,512,2048]

Per context length, one fleet (1 prefill + 1 decode worker on cpu:0/cpu:1, spare slots cpu:2/cpu:3) with
the sessions streaming throughout (prompts of that many tokens): migrate decode-0 live to cpu:2, then via
checkpoint to cpu:3, then checkpoint it, make the checkpoint incompatible (another torch version in its
manifest) and restore it on cpu:1. A session's client-seen downtime for an operation is the longest gap
between two of its tokens while the operation runs: its last token before the switch to its first after
it (one inter-token interval of it is ordinary decoding: `itl` is the median gap before the operations).
`--test-model` writes a small random Llama (the tests' small model, 4,096 positions) instead of a real one.
"""

import argparse
import asyncio
import itertools
import json
import shutil
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx

from fleetctl.console.cli.models import resolve_model
from fleetctl.console.loadgen.local_fleet import local_fleet
from fleetctl.console.loadgen.requests import WORDS
from fleetctl.engine.api.admin_token import read_admin_token
from fleetctl.engine.model.model_config import ModelConfig
from fleetctl.engine.model.tokenizer import Tokenizer


class Streams:
    """The sessions, streaming in a thread until stopped; each one's token arrival times (perf_counter)."""

    def __init__(self, url: str, model: str, prompts: list[str], max_tokens: int) -> None:
        self.times: list[list[float]] = [[] for _ in prompts]
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=asyncio.run, args=(self._run(url, model, prompts, max_tokens),))
        self._thread.start()

    async def _run(self, url: str, model: str, prompts: list[str], max_tokens: int) -> None:
        async def one(http: httpx.AsyncClient, i: int) -> None:
            body = {"model": model, "prompt": prompts[i], "max_tokens": max_tokens, "temperature": 0,
                    "ignore_eos": True, "stream": True}
            headers = {"X-Request-Id": f"bench-{i}"}
            async with http.stream("POST", "/v1/completions", json=body, headers=headers) as response:
                async for line in response.aiter_lines():
                    if self._stop.is_set():
                        return
                    if '"error"' in line:
                        self.errors.append(line)
                    elif line.startswith("data: {"):
                        self.times[i].append(time.time())

        async with httpx.AsyncClient(base_url=url, timeout=httpx.Timeout(3600.0)) as http:
            await asyncio.gather(*[one(http, i) for i in range(len(prompts))])

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def resumed(self, after: float, timeout: float = 120.0) -> float:
        """Wait until every session has a token after `after`; returns when the last one's came."""
        deadline = time.time() + timeout
        while time.time() < deadline and not all(times and times[-1] > after for times in self.times):
            time.sleep(0.05)
        return max(next(t for t in times if t > after) for times in self.times)

    def gaps(self, start: float, end: float) -> list[float]:
        """Per session, its longest gap between two tokens with the later one in [start, end]."""
        found = []
        for times in self.times:
            inside = [b - a for a, b in itertools.pairwise(times) if start <= b <= end]
            found.append(max(inside, default=float("nan")))
        return found

    def gap_at(self, session: int, moment: float) -> float:
        """The session's gap at `moment` (when the controller had its first token from the destination):
        the longer of the gaps before and after the first token the client had by then (its last token
        from the source may reach the client after that moment)."""
        times = self.times[session]
        after = next(i for i, t in enumerate(times) if t >= moment)
        return max(times[i] - times[i - 1] for i in (after, after + 1) if 0 < i < len(times))

    def itl(self, before: float) -> float:
        return statistics.median(b - a for times in self.times for a, b in itertools.pairwise(times)
                                 if b < before)


def run_op(url: str, path: str, body: dict, streams: Streams, since: float | None = None) -> tuple[dict, list[float]]:
    """Run an operation; its result and each session's longest gap between tokens from its start (or
    `since`) to its first token after it."""
    start = time.time()
    headers = {"Authorization": f"Bearer {read_admin_token()}"}
    op = httpx.post(f"{url}{path}", json=body, headers=headers, timeout=60).json()
    while op["state"] == "running":
        time.sleep(0.05)
        op = httpx.get(f"{url}/fleet/operations/{op['id']}", timeout=60).json()
    if op["state"] != "done":
        raise SystemExit(f"{path} failed: {op['error']}")
    if path.endswith("/checkpoint"):  # the sessions stay paused until the restore
        return op["result"], []
    return op["result"], streams.gaps(since or start, streams.resumed(time.time()))


def decoding(url: str) -> int:
    workers = httpx.get(f"{url}/fleet/workers", timeout=60).json()["workers"]
    return next(w["sessions"] for w in workers if w["id"] == "decode-0")


def prompt_of(tokenizer: Tokenizer, tokens: int, salt: int) -> str:
    """About `tokens` tokens of words, different per session."""
    words = [f"Session {salt}:"]
    while len(tokenizer.encode(" ".join(words))) < tokens:
        words.extend(WORDS[(salt * 7 + len(words) + j) % len(WORDS)] for j in range(8))
    while len(tokenizer.encode(" ".join(words))) > tokens:
        words.pop()
    return " ".join(words)


def bench_context(model_dir: Path, args: argparse.Namespace, context: int) -> dict:
    config = ModelConfig.from_file(model_dir / "config.json")
    tokenizer = Tokenizer(model_dir, config.eos_token_ids)
    prompts = [prompt_of(tokenizer, context, i) for i in range(args.sessions)]
    max_tokens = min(args.max_tokens, config.max_position_embeddings - context - 16)
    blocks = args.sessions * (context + max_tokens) // 16 + 64
    with local_fleet(model_dir, "--prefill", "1", "--decode", "1", "--devices", "cpu:0,cpu:1", "--dtype", args.dtype,
                     "--kv-blocks", str(blocks)) as url:
        model = httpx.get(f"{url}/v1/models", timeout=60).json()["data"][0]["id"]
        streams = Streams(url, model, prompts, max_tokens)
        while decoding(url) < args.sessions:
            time.sleep(0.2)
        time.sleep(2.0)  # every session decoding
        itl = streams.itl(time.time())
        live, live_window = run_op(url, "/fleet/workers/decode-0/migrate", {"to": "cpu:2"}, streams)
        print("live", json.dumps({k: v for k, v in live.items() if k != "moves"}), flush=True)
        live_gaps = [streams.gap_at(int(mv["request"].removeprefix("bench-")), mv["resumed_at"])
                     for mv in live["moves"]]
        disk, disk_gaps = run_op(url, "/fleet/workers/decode-0/migrate", {"to": "cpu:3", "via": "checkpoint"},
                                 streams)
        print("checkpoint", json.dumps(disk), flush=True)
        cold_start = time.time()  # the sessions pause here and go on after the restore
        saved, _ = run_op(url, "/fleet/workers/decode-0/checkpoint", {"hold_s": 600}, streams)
        manifest_path = Path(saved["checkpoint"]) / "manifest.json"
        manifest = json.loads(manifest_path.read_text())
        manifest["compat"]["torch"] = "another-torch"
        manifest_path.write_text(json.dumps(manifest))
        cold, cold_gaps = run_op(url, "/fleet/restore", {"checkpoint": saved["checkpoint"], "device": "cpu:1"},
                                 streams, since=cold_start)
        print("cold start", json.dumps(cold), flush=True)
        streams.stop()
    for path in (disk["checkpoint"], saved["checkpoint"]):  # this run's, nobody else's
        shutil.rmtree(path, ignore_errors=True)
    return {"context": context, "itl_s": itl, "live": live, "live_gaps": live_gaps, "live_window": live_window,
            "disk": disk,
            "disk_gaps": disk_gaps, "cold": cold, "cold_gaps": cold_gaps, "errors": len(streams.errors),
            "checkpoint_bytes": saved["bytes"], "checkpoint_s": saved["seconds"]}


def test_model(folder: Path) -> Path:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
    from support.tiny_model import write_tiny_llama

    return write_tiny_llama(folder, seed=1, hidden_size=256, intermediate_size=1024, num_hidden_layers=8,
                            num_attention_heads=8, num_key_value_heads=2, head_dim=32, max_position_embeddings=4096)


def ms(seconds: float) -> str:
    return f"{seconds * 1000:8.1f}"


def print_row(row: dict) -> None:
    live, disk, cold, window = (sorted(g for g in row[k] if g == g)
                                for k in ("live_gaps", "disk_gaps", "cold_gaps", "live_window"))
    print(f"{row['context']:>8} {ms(row['itl_s'])} | {ms(statistics.median(live))} {ms(live[-1])} "
          f"{ms(row['live']['downtime_s'])} {ms(window[-1])} | {ms(statistics.median(disk))} {ms(disk[-1])} | "
          f"{ms(statistics.median(cold))} {ms(cold[-1])} | {statistics.median(cold) / statistics.median(live):9.1f} "
          f"{row['checkpoint_bytes'] / 2**20:8.1f} {row['checkpoint_s']:7.3f}   stream errors {row['errors']}")
    print(f"{'':>8} checkpoint write inside migrate --via checkpoint {row['disk']['checkpoint_s']:.3f} s vs "
          f"standalone {row['checkpoint_s']:.3f} s ({row['checkpoint_bytes'] / 2**20:.1f} MiB)", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--test-model", action="store_true", help="a small random Llama instead of --model")
    parser.add_argument("--sessions", type=int, default=16)
    parser.add_argument("--contexts", default="128,512,2048")
    parser.add_argument("--max-tokens", type=int, default=2000)
    parser.add_argument("--dtype", default="auto")
    args = parser.parse_args()
    header = (f"model {'test model (small random Llama)' if args.test_model else args.model}, {args.sessions} "
              f"sessions; client-seen downtime in ms, median / max over sessions. live: the gap between a session's "
              f"last token from the source and its first from the destination; ckpt (migrate --via checkpoint) and "
              f"cold (checkpoint + incompatible restore): each session's longest gap from the pause to its first "
              f"token after; window: live's longest gap over the whole migration; srv: the controller's longest "
              f"live downtime; itl: the median gap before\n"
              f"{'context':>8} {'itl':>8} | {'live med':>8} {'live max':>8} {'srv max':>8} {'window':>8} | "
              f"{'ckpt med':>8} {'ckpt max':>8} | {'cold med':>8} {'cold max':>8} | {'cold/live':>9} {'ckpt MiB':>8} "
              f"{'write s':>7}")
    rows = []
    with tempfile.TemporaryDirectory() as scratch:
        model_dir = test_model(Path(scratch)) if args.test_model else resolve_model(args.model)
        for context in args.contexts.split(","):
            rows.append(bench_context(model_dir, args, int(context)))
            print(header)
            for row in rows:
                print_row(row)


if __name__ == "__main__":
    main()
