"""Chaos runs: real fleets (`fleetctl serve`, worker processes on CPU slots) under injected faults, while
streaming clients run. Each scenario starts a fresh fleet, sends its requests at once and disturbs the fleet
(fault points keyed by request id, signals, operations that fail), then checks that

    every request ended: completed with exactly the text of an undisturbed run (`--deterministic`), or with
    one clear error (an in-band error event, or a 4xx refusal) — never lost (no end within the bound, a
    dropped connection) and never a 5xx;
    every running worker's KV blocks are free again, and no handoff buffer of the fleet is left in /dev/shm.

    python scripts/chaos.py [--model PATH] [--requests 24] [--tokens 96] [--only NAME …] [--json]

Without --model it writes a small random Llama (tests/support/tiny_model.py) to a temporary directory. Prints one
table row per scenario; exits 1 if any row has a lost request, a 5xx, a wrong text or a leak.
tests/fleet/test_chaos_fleet.py runs the same scenarios at a small size."""

import argparse
import asyncio
import json
import os
import signal
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from fleetctl.console.loadgen.local_fleet import FLEETCTL, local_fleet
from fleetctl.engine.api.admin_token import read_admin_token
from fleetctl.engine.worker.shm_files import SHM_DIR, buffers

TARGET = "-t"  # request ids containing this are the ones the scenario's fault points aim at
REQUEST_BOUND_S = 240.0  # a request that has not ended by then is lost
COMMON = ("--dtype", "float32", "--deterministic", "--kv-blocks", "256", "--heartbeat-timeout", "3",
          "--step-timeout", "3", "--checkpoint-timeout", "3", "--no-access-log")
DISAGGREGATED = ("--prefill", "1", "--decode", "2", "--devices", "cpu:0,cpu:1,cpu:2")
Disturb = Callable[["Fleet"], Awaitable[int]]  # returns the faults it injected itself


@dataclass(frozen=True)
class Scenario:
    name: str
    faults: str = ""  # FLEET_FAULTS (counted faults: the firings are the marker files)
    disturb: Disturb | None = None
    layout: tuple[str, ...] = DISAGGREGATED
    targets: int = 2  # requests whose ids carry TARGET
    poisoned: bool = False  # targeted requests must end with an error (all others complete)


@dataclass
class Fleet:
    url: str
    admin: dict[str, str]
    http: httpx.AsyncClient

    async def workers(self) -> dict[str, dict]:
        return {w["id"]: w for w in (await self.http.get(f"{self.url}/fleet/workers")).json()["workers"]}

    async def until(self, predicate: Callable[[dict[str, dict]], bool], timeout: float = 120.0) -> dict[str, dict]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            workers = await self.workers()
            if predicate(workers):
                return workers
            await asyncio.sleep(0.05)
        raise TimeoutError("the fleet did not get there in time")

    async def operation(self, path: str, body: dict) -> dict:
        op = (await self.http.post(f"{self.url}{path}", json=body, headers=self.admin)).json()
        while op.get("state") == "running":
            await asyncio.sleep(0.1)
            op = (await self.http.get(f"{self.url}/fleet/operations/{op['id']}")).json()
        return op


@dataclass
class Row:
    scenario: str
    requests: int = 0
    faults: int = 0
    completed: int = 0
    clean_errors: int = 0
    wrong: int = 0  # completed with a text other than the undisturbed run's
    lost: int = 0
    http_5xx: int = 0
    leaked_shm: int = 0
    leaked_blocks: int = 0
    seconds: float = 0.0
    errors: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not (self.wrong or self.lost or self.http_5xx or self.leaked_shm or self.leaked_blocks)


# ---- disturbances ------------------------------------------------------------------------------

def signal_worker(worker: str, sig: signal.Signals) -> Disturb:
    async def disturb(fleet: Fleet) -> int:
        workers = await fleet.until(lambda w: w[worker]["sessions"] >= 2)
        os.kill(workers[worker]["pid"], sig)
        return 1

    return disturb


async def restore_that_fails(fleet: Fleet) -> int:
    """Stand decode-0 down with its sessions held for a few seconds; its restore fails (fault point)."""
    await fleet.until(lambda w: w["decode-0"]["sessions"] >= 2)
    saved = await fleet.operation("/fleet/workers/decode-0/checkpoint", {"hold_s": 4})
    restore = await fleet.operation("/fleet/restore", {"checkpoint": saved["result"]["checkpoint"], "device": "cpu:3"})
    assert restore["state"] == "failed", restore
    return 0  # the restore fault point counts itself


async def migrate_that_times_out(fleet: Fleet) -> int:
    await fleet.until(lambda w: w["decode-0"]["sessions"] >= 2)
    op = await fleet.operation("/fleet/workers/decode-0/migrate", {"to": "cpu:3", "via": "checkpoint"})
    assert op["state"] == "failed" and "not written within" in op["error"], op
    return 1


SCENARIOS = (
    Scenario("prefill dies before publishing", faults=f"publish@{TARGET}=exit:9*2"),
    Scenario("decode dies adopting", faults=f"adopt@{TARGET}=exit:9*2"),
    Scenario("decode killed mid-stream", disturb=signal_worker("decode-0", signal.SIGKILL)),
    Scenario("decode stopped (SIGSTOP)", disturb=signal_worker("decode-0", signal.SIGSTOP)),
    Scenario("a step stalls (hung worker)", faults=f"step@{TARGET}=stall:60*1"),
    Scenario("poisoned request", faults=f"step@{TARGET}=raise*30", poisoned=True),
    Scenario("restore fails", faults="restore=raise*1", disturb=restore_that_fails),
    Scenario("last decode worker killed", disturb=signal_worker("decode-0", signal.SIGKILL),
             layout=("--prefill", "1", "--decode", "1", "--devices", "cpu:0,cpu:1")),
    Scenario("checkpoint times out", faults="checkpoint-write=stall:30", disturb=migrate_that_times_out),
)


# ---- one run -----------------------------------------------------------------------------------

def prompts(count: int) -> list[str]:
    return [f"Request {i}: the quick brown fox jumps over the lazy dog" for i in range(count)]


def undisturbed(model: Path, texts: list[str], tokens: int) -> list[str]:
    """What each prompt's stream must read: `fleetctl generate` on the same numerics, one batch."""
    import subprocess

    result = subprocess.run([*FLEETCTL, "generate", "--model", str(model), "--json", "--dtype", "float32",
                             "--deterministic", "--max-tokens", str(tokens), "--ignore-eos", *texts],
                            capture_output=True, text=True, timeout=600, check=True)
    return [json.loads(line)["text"] for line in result.stdout.splitlines()]


async def stream(http: httpx.AsyncClient, url: str, model: str, prompt: str, tokens: int, request_id: str,
                 row: Row) -> str | None:
    """One streaming completion: its text when it completed, None after a clean error (counted in `row`)."""
    body = {"model": model, "prompt": prompt, "max_tokens": tokens, "temperature": 0, "stream": True,
            "ignore_eos": True}
    text, ended = "", False
    try:
        async with asyncio.timeout(REQUEST_BOUND_S), http.stream(
                "POST", f"{url}/v1/completions", json=body, headers={"X-Request-Id": request_id}) as response:
            if response.status_code >= 500:
                row.http_5xx += 1
                row.errors.append(f"{request_id}: HTTP {response.status_code}: {(await response.aread())[:200]!r}")
                return None
            if response.status_code >= 400:
                row.clean_errors += 1
                return None
            async for line in response.aiter_lines():
                if not line.startswith("data: "):
                    continue
                if line == "data: [DONE]":
                    ended = True
                    break
                chunk = json.loads(line.removeprefix("data: "))
                if "error" in chunk:
                    row.clean_errors += 1
                    row.errors.append(f"{request_id}: {chunk['error']['message']}")
                    return None
                text += chunk["choices"][0]["text"] if chunk["choices"] else ""
    except (TimeoutError, httpx.HTTPError) as exc:
        row.errors.append(f"{request_id}: lost ({type(exc).__name__})")
    if not ended:
        row.lost += 1
        return None
    row.completed += 1
    return text


async def run(scenario: Scenario, model: Path, texts: list[str], expected: list[str], tokens: int) -> Row:
    row = Row(scenario.name, requests=len(texts))
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="fleetctl-faults-") as fault_dir:
        env = {"FLEET_FAULTS": scenario.faults, "FLEET_FAULTS_DIR": fault_dir}
        with local_fleet(model, *scenario.layout, *COMMON, env=env) as url:
            async with httpx.AsyncClient(timeout=httpx.Timeout(30.0, read=REQUEST_BOUND_S)) as http:
                fleet = Fleet(url, {"Authorization": f"Bearer {read_admin_token()}"}, http)
                fleet_pid = (await http.get(f"{url}/fleet/status")).json()["pid"]
                model_name = (await http.get(f"{url}/v1/models")).json()["data"][0]["id"]
                ids = [f"c{i}{TARGET if i < scenario.targets else ''}" for i in range(len(texts))]
                clients = [stream(http, url, model_name, text, tokens, rid, row)
                           for text, rid in zip(texts, ids, strict=True)]
                disturbance = scenario.disturb(fleet) if scenario.disturb else asyncio.sleep(0, 0)
                *results, injected = await asyncio.gather(*clients, disturbance)
                row.faults = injected + len(os.listdir(fault_dir))
                for rid, text, want in zip(ids, results, expected, strict=True):
                    if text is not None and text != want:
                        row.wrong += 1
                        row.errors.append(f"{rid}: wrong text")
                    elif scenario.poisoned and (text is None) != (TARGET in rid):
                        row.wrong += 1
                        row.errors.append(f"{rid}: {'failed' if text is None else 'completed'}")
                row.leaked_blocks = await leaked_blocks(fleet)
        row.leaked_shm = sum(1 for b in buffers(SHM_DIR) if b.fleet_pid == fleet_pid)
    row.seconds = round(time.monotonic() - started, 1)
    return row


async def leaked_blocks(fleet: Fleet, timeout: float = 15.0) -> int:
    """KV blocks not free on running workers once every request ended (0 as soon as they are all back)."""
    deadline = time.monotonic() + timeout
    while True:
        running = [w for w in (await fleet.workers()).values() if w["state"] == "running"]
        missing = sum(w["kv_blocks"] - w["free_blocks"] for w in running)
        if not missing or time.monotonic() > deadline:
            return missing
        await asyncio.sleep(0.2)


def small_model(folder: Path) -> Path:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
    from support import tiny_model

    return tiny_model.write_tiny_llama(folder, seed=1, hidden_size=256, intermediate_size=1024, num_hidden_layers=8,
                                       num_attention_heads=8, num_key_value_heads=2, head_dim=32,
                                       max_position_embeddings=1024)


def table(rows: list[Row]) -> str:
    head = (f"{'scenario':<32} {'requests':>8} {'faults':>6} {'completed':>9} {'clean errors':>12} {'wrong':>5} "
            f"{'lost':>4} {'5xx':>3} {'leaked shm':>10} {'leaked blocks':>13} {'seconds':>7}")
    lines = [head, "-" * len(head)]
    lines += [f"{r.scenario:<32} {r.requests:>8} {r.faults:>6} {r.completed:>9} {r.clean_errors:>12} {r.wrong:>5} "
              f"{r.lost:>4} {r.http_5xx:>3} {r.leaked_shm:>10} {r.leaked_blocks:>13} {r.seconds:>7}" for r in rows]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", type=Path)
    parser.add_argument("--requests", type=int, default=24)
    parser.add_argument("--tokens", type=int, default=96)
    parser.add_argument("--only", nargs="*", help="scenario names (substrings) to run")
    parser.add_argument("--json", action="store_true", help="one JSON object per scenario, one per line")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        model = args.model or small_model(Path(scratch))
        texts = prompts(args.requests)
        expected = undisturbed(model, texts, args.tokens)
        chosen = [s for s in SCENARIOS if not args.only or any(part in s.name for part in args.only)]
        rows = []
        for scenario in chosen:
            rows.append(asyncio.run(run(scenario, model, texts, expected, args.tokens)))
            if args.json:
                print(json.dumps(rows[-1].__dict__), flush=True)
    if not args.json:
        print(table(rows))
        for row in rows:
            for error in row.errors[:5]:
                print(f"  {row.scenario}: {error}")
    sys.exit(0 if all(row.ok for row in rows) else 1)


if __name__ == "__main__":
    main()
