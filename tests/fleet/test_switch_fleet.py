"""`fleetctl switch` on a real fleet (worker processes on CPU slots, HTTP, the CLI) while streams run: a decode
worker becomes a prefill worker and a prefill worker a decode worker, each the same process, its sessions moved
live first; every stream is token-identical to a plain `generate` (`--deterministic`), and the switched workers
serve their new roles. A lone decode worker becomes mixed and back with its sessions kept by the same process
(no peer decodes). `rebalance` goes from 1:2 to colocated and back by switches under streams. A switch the
worker fails leaves it serving its old role; bad switches are refused."""

from pathlib import Path

import httpx
import pytest
from support.fleet_harness import Stream, cli_json, fleetctl, generate_json, serve, start_streams, wait_until, workers

from fleetctl.engine.worker.shm_files import SHM_DIR, buffers

pytestmark = pytest.mark.fleet  # real worker processes and a real server

PROMPTS = ["The quick brown fox", "Once upon a time there was", "def add(a, b):", "Numbers 0 1 2 3",
           "Prefill reads the prompt", "decode writes the answer"]
TOKENS = 120
FLEET = ("--prefill", "1", "--decode", "2", "--devices", "cpu:0,cpu:1,cpu:2", "--dtype", "float32",
         "--deterministic")
SLOW_STEPS = {"FLEET_FAULTS": "step=stall:0.05"}  # each step slowed: a session is still decoding when it moves


def decoding(url: str, worker: str) -> int:
    """Sessions `worker` holds that decode (past their handoff, 8 tokens in)."""
    sessions = httpx.get(f"{url}/fleet/workers/{worker}/sessions", timeout=10).json()["sessions"]
    return sum(1 for s in sessions if s["stage"] == "decode" and s["output_tokens"] >= 8)


def served_by(url: str, request_ids: set[str]) -> set[tuple[str | None, str | None]]:
    """(prefill worker, decode worker) of each of the requests, from /fleet/requests."""
    rows = httpx.get(f"{url}/fleet/requests", params={"limit": 1000}, timeout=10).json()["requests"]
    return {(r["prefill_worker"], r["decode_worker"]) for r in rows if r["request_id"] in request_ids}


def test_switch_each_way_in_place_under_streams(tiny_model_dir: Path) -> None:
    reference = [r["text"] for r in generate_json(tiny_model_dir, PROMPTS, "--dtype", "float32", "--deterministic",
                                                  "--max-tokens", str(TOKENS), "--ignore-eos")]
    with serve(tiny_model_dir, *FLEET, env=SLOW_STEPS) as url:
        first = start_streams(url, PROMPTS[:4], TOKENS)
        assert wait_until(lambda: decoding(url, "decode-1") >= 1, 60)
        pids = {wid: info["pid"] for wid, info in workers(url).items()}

        to_prefill = cli_json("switch", "decode-1", "--role", "prefill", "--url", url)
        assert {k: to_prefill[k] for k in ("worker", "was", "from", "to", "pid")} == {
            "worker": "prefill-1", "was": "decode-1", "from": "decode", "to": "prefill", "pid": pids["decode-1"]}
        assert to_prefill["sessions_moved"] >= 1, to_prefill  # it held a decoding session: that moved to decode-0, live
        assert to_prefill["out_of_service_s"] >= to_prefill["switch_s"] >= 0
        now = workers(url)
        assert "decode-1" not in now
        assert (now["prefill-1"]["role"], now["prefill-1"]["state"], now["prefill-1"]["was"]) == (
            "prefill", "running", "decode-1")

        to_decode = cli_json("switch", "prefill-0", "--role", "decode", "--url", url)
        assert (to_decode["worker"], to_decode["was"], to_decode["pid"]) == ("decode-2", "prefill-0", pids["prefill-0"])
        assert to_decode["sessions_moved"] == 0  # a prefill worker's prompts finish, their KV handed off
        assert first.result(timeout=600) == reference[:4]

        ids = [f"after-{i}" for i in range(4)]
        second = start_streams(url, [Stream(p, request_id=rid) for p, rid in zip(PROMPTS[2:], ids, strict=True)],
                               TOKENS)
        assert second.result(timeout=600) == reference[2:]
        assert wait_until(lambda: len(served_by(url, set(ids))) >= 1, 10)
        pairs = served_by(url, set(ids))
        assert {p for p, _ in pairs} == {"prefill-1"}  # the only prefill worker now: the one that was decode-1
        assert {d for _, d in pairs} <= {"decode-0", "decode-2"} and "decode-2" in {d for _, d in pairs}

        assert wait_until(lambda: switch_events(url) == [("prefill-1", "decode-1"), ("decode-2", "prefill-0")], 10)
        # nothing of the old layouts is left: every block free again, no KV buffer published by the switched ones
        assert wait_until(lambda: all(w["free_blocks"] == w["kv_blocks"] for w in workers(url).values()), 30)
        switched = {pids["decode-1"], pids["prefill-0"]}
        assert not [b for b in buffers(SHM_DIR) if b.producer_pid in switched]


def test_a_lone_decode_worker_keeps_its_sessions_through_switches_to_mixed_and_back(tiny_model_dir: Path) -> None:
    """1 prefill + 1 decode: no peer decodes, so decode-0's sessions stay in its process as it becomes mixed-0
    and then decode-1; every stream is token-identical to `generate`, and the mixed worker takes prompts."""
    reference = [r["text"] for r in generate_json(tiny_model_dir, PROMPTS, "--dtype", "float32", "--deterministic",
                                                  "--max-tokens", str(TOKENS), "--ignore-eos")]
    lone = ("--prefill", "1", "--decode", "1", "--devices", "cpu:0,cpu:1", "--dtype", "float32", "--deterministic")
    with serve(tiny_model_dir, *lone, env=SLOW_STEPS) as url:
        pid = workers(url)["decode-0"]["pid"]
        first = start_streams(url, PROMPTS[:4], TOKENS)
        assert wait_until(lambda: decoding(url, "decode-0") >= 2, 60)
        to_mixed = cli_json("switch", "decode-0", "--role", "mixed", "--url", url)
        assert (to_mixed["worker"], to_mixed["pid"], to_mixed["sessions_moved"]) == ("mixed-0", pid, 0)
        assert to_mixed["sessions_kept"] >= 2, to_mixed
        assert decoding(url, "mixed-0") >= 1  # they go on there, under its new id
        second = start_streams(url, PROMPTS[4:], TOKENS)
        back = cli_json("switch", "mixed-0", "--role", "decode", "--url", url)
        assert (back["worker"], back["pid"], back["sessions_moved"]) == ("decode-1", pid, 0)
        assert first.result(timeout=600) == reference[:4]
        assert second.result(timeout=600) == reference[4:]
        assert back["sessions_kept"] + back["sessions_finished"] >= 1, back


def test_rebalance_to_colocated_and_back_in_place_under_streams(tiny_model_dir: Path) -> None:
    """1:2 -> colocated 3 -> 1:2 while streams decode: the same three processes throughout, each worker switched
    with its sessions moved live to one that decodes, and every stream token-identical to a plain `generate`."""
    reference = [r["text"] for r in generate_json(tiny_model_dir, PROMPTS, "--dtype", "float32", "--deterministic",
                                                  "--max-tokens", str(TOKENS), "--ignore-eos")]
    with serve(tiny_model_dir, *FLEET, env=SLOW_STEPS) as url:
        pids = {info["pid"] for info in workers(url).values()}
        first = start_streams(url, PROMPTS, TOKENS)
        assert wait_until(lambda: decoding(url, "decode-0") + decoding(url, "decode-1") >= 2, 60)

        there = cli_json("rebalance", "--split", "0:0:3", "--apply", "--url", url)
        assert (there["from"], there["split"], there["via"]) == ("1:2", "colocated 3", "switch")
        assert sorted((m["from"], m["to"]) for m in there["moves"]) == [
            ("decode", "mixed"), ("decode", "mixed"), ("prefill", "mixed")]
        assert sum(m["sessions_moved"] for m in there["moves"]) >= 1, there  # decoding sessions moved, live
        now = workers(url)
        assert sorted(now) == ["mixed-0", "mixed-1", "mixed-2"] and {w["pid"] for w in now.values()} == pids
        second = start_streams(url, PROMPTS[:3], TOKENS)  # the colocated fleet serves new prompts end to end
        assert wait_until(lambda: sum(decoding(url, w) for w in now) >= 2, 60)

        back = cli_json("rebalance", "--split", "1:2", "--apply", "--url", url)
        assert (back["from"], back["split"]) == ("colocated 3", "1:2")
        now = workers(url)
        assert sorted(w["role"] for w in now.values()) == ["decode", "decode", "prefill"]
        assert {w["pid"] for w in now.values()} == pids
        assert first.result(timeout=600) == reference
        assert second.result(timeout=600) == reference[:3]
        assert start_streams(url, PROMPTS[3:], TOKENS).result(timeout=600) == reference[3:]


def switch_events(url: str) -> list[tuple[str, str]]:
    """(new id, was) of each switch event in the store, oldest first."""
    events = httpx.get(f"{url}/fleet/history", params={"since": 600}, timeout=10).json()["events"]
    return [(e["worker"], e["details"]["was"]) for e in events if e["kind"] == "switch"]


def test_a_failed_switch_leaves_the_worker_serving_its_old_role(tiny_model_dir: Path) -> None:
    with serve(tiny_model_dir, *FLEET, env={"FLEET_FAULTS": "switch@decode-1=raise:no room"}) as url:
        failed = fleetctl("switch", "decode-1", "--role", "prefill", "--url", url)
        assert failed.returncode == 1
        assert "the switch of decode-1 to prefill was called off: InjectedFault: no room; decode-1 is running as " \
               "a decode worker" in failed.stderr
        now = workers(url)
        assert (now["decode-1"]["role"], now["decode-1"]["state"]) == ("decode", "running")
        assert start_streams(url, PROMPTS[:4], 20).result(timeout=300) == [
            r["text"] for r in generate_json(tiny_model_dir, PROMPTS[:4], "--dtype", "float32", "--deterministic",
                                             "--max-tokens", "20", "--ignore-eos")]

        refusals = {
            ("decode-0", "--role", "decode"): "HTTP 409: decode-0 is already a decode worker",
            ("decode-9", "--role", "prefill"): "HTTP 404: unknown worker 'decode-9'",
            ("prefill-0", "--role", "decode"): "HTTP 409: cannot switch prefill-0: it is the last running prefill",
        }
        for args, message in refusals.items():
            result = fleetctl("switch", *args, "--url", url)
            assert result.returncode == 1 and message in result.stderr, result.stderr
        assert {w: (info["role"], info["state"]) for w, info in workers(url).items()} == {
            "prefill-0": ("prefill", "running"), "decode-0": ("decode", "running"), "decode-1": ("decode", "running")}
