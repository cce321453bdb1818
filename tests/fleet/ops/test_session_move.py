"""Live session moves on a real fleet (1 prefill + 2 decode workers on CPU slots, `--deterministic`): a
session moved mid-stream — greedy and seeded, once, there and back, eight at once — streams exactly the
tokens `fleetctl generate` makes, and a move whose destination or source dies at any stage still ends
every stream identically, leaving no block held on the survivors."""

import json
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
from support.fleet_harness import Stream, admin, fleetctl, generate_json, serve, start_streams, wait_until, worker_pids

from fleetctl.engine.worker.shm_files import SHM_DIR, buffers

pytestmark = pytest.mark.fleet  # real worker processes and a real server

TOKENS = 120
PROMPTS = [f"Session {i} says" + " hello there" * (3 * i + 1) for i in range(8)]
SAMPLED = {1, 4}  # these sample (temperature 0.9, seed 7); the others are greedy
FLEET = ("--prefill", "1", "--decode", "2", "--devices", "cpu:0,cpu:1,cpu:2", "--dtype", "float32",
         "--deterministic", "--kv-blocks", "256")


@pytest.fixture(scope="module")
def expected(small_model_dir: Path) -> list[str]:
    common = ("--dtype", "float32", "--deterministic", "--max-tokens", str(TOKENS), "--ignore-eos")
    greedy = generate_json(small_model_dir, [p for i, p in enumerate(PROMPTS) if i not in SAMPLED], *common)
    sampled = generate_json(small_model_dir, [p for i, p in enumerate(PROMPTS) if i in SAMPLED], *common,
                            "--temperature", "0.9", "--seed", "7")
    by_kind = {False: iter(greedy), True: iter(sampled)}
    return [next(by_kind[i in SAMPLED])["text"] for i in range(len(PROMPTS))]


def session(i: int, request_id: str | None = None) -> Stream:
    """PROMPTS[i] as these tests stream it (sampled or greedy), sent as s<i> unless `request_id` names it."""
    sampling = {"temperature": 0.9, "seed": 7} if i in SAMPLED else {}
    return Stream(PROMPTS[i], request_id=request_id or f"s{i}", **sampling)


SESSIONS = [session(i) for i in range(len(PROMPTS))]


def holders(url: str) -> dict[str, str]:
    """Request id -> the worker holding it, for every decode worker's sessions."""
    found = {}
    for worker in ("decode-0", "decode-1"):
        sessions = httpx.get(f"{url}/fleet/workers/{worker}/sessions", timeout=10).json()["sessions"]
        found |= {s["id"]: worker for s in sessions if s["stage"] == "decode" and s["output_tokens"] >= 8}
    return found


def other(worker: str) -> str:
    return "decode-1" if worker == "decode-0" else "decode-0"


def move(url: str, request_id: str, to: str) -> dict:
    op = httpx.post(f"{url}/fleet/requests/{request_id}/move", json={"to": to}, headers=admin(), timeout=30).json()
    assert "id" in op, op
    deadline = time.monotonic() + 300
    while op["state"] == "running" and time.monotonic() < deadline:
        time.sleep(0.02)
        op = httpx.get(f"{url}/fleet/operations/{op['id']}", timeout=10).json()
    return op


def free_blocks(url: str) -> dict[str, tuple[int, int]]:
    """Running worker -> (free blocks, blocks)."""
    workers = httpx.get(f"{url}/fleet/workers", timeout=10).json()["workers"]
    return {w["id"]: (w["free_blocks"], 256) for w in workers if w["state"] == "running"}


def no_blocks_held(url: str) -> bool:
    return all(free == total for free, total in free_blocks(url).values())


def test_move_greedy_and_seeded_sessions_there_and_back(small_model_dir: Path, expected: list[str]) -> None:
    # each step slowed (a fault point's stall): s1 must still be decoding after its second move
    with serve(small_model_dir, *FLEET, env={"FLEET_FAULTS": "step=stall:0.1"}) as url:
        streams = start_streams(url, SESSIONS[:2], TOKENS, "small-llama0")  # s0 greedy, s1 seeded
        assert wait_until(lambda: {"s0", "s1"} <= holders(url).keys(), 120)
        placed = holders(url)
        result = fleetctl("move", "s0", "--to", other(placed["s0"]), "--url", url, "--json")
        assert result.returncode == 0, result.stderr
        moved = json.loads(result.stdout)
        assert moved["from"] == placed["s0"] and moved["to"] == other(placed["s0"])
        assert moved["stages"][0]["stage"] == "reserve" and moved["stages"][-1]["stage"] == "final"
        assert moved["bytes"] > 0 and moved["downtime_s"] is not None
        there = move(url, "s1", other(placed["s1"]))
        assert there["state"] == "done", there
        back = move(url, "s1", placed["s1"])  # A -> B -> A
        assert back["state"] == "done", back
        assert streams.result(timeout=600) == expected[:2]
        assert wait_until(lambda: no_blocks_held(url), 30), free_blocks(url)
        metrics = httpx.get(f"{url}/metrics", timeout=10).text
        assert "fleet_migration_downtime_seconds_count 3.0" in metrics


def test_eight_sessions_move_at_once(small_model_dir: Path, expected: list[str]) -> None:
    with serve(small_model_dir, *FLEET) as url:
        streams = start_streams(url, SESSIONS[:8], TOKENS, "small-llama0")
        assert wait_until(lambda: len(holders(url)) == 8, 180)
        placed = holders(url)
        with ThreadPoolExecutor(8) as pool:
            ops = list(pool.map(lambda rid: move(url, rid, other(placed[rid])), sorted(placed)))
        assert [op["state"] for op in ops] == ["done"] * 8, [op["error"] for op in ops]
        assert streams.result(timeout=600) == expected
        assert wait_until(lambda: no_blocks_held(url), 30), free_blocks(url)


def test_move_refusals_change_nothing(small_model_dir: Path, expected: list[str]) -> None:
    with serve(small_model_dir, *FLEET) as url:
        streams = start_streams(url, SESSIONS[:1], TOKENS, "small-llama0")
        assert wait_until(lambda: "s0" in holders(url), 120)
        source = holders(url)["s0"]
        for request_id, body, status in [
            ("nope", {"to": "decode-1"}, 404),
            ("s0", {"to": "decode-9"}, 404),
            ("s0", {"to": "prefill-0"}, 409),  # another role
            ("s0", {"to": source}, 409),  # already there
            ("s0", {}, 400),
            ("s0", {"to": 3}, 400),
        ]:
            response = httpx.post(f"{url}/fleet/requests/{request_id}/move", json=body, headers=admin(), timeout=10)
            assert response.status_code == status, (request_id, body, response.text)
        unauthorised = httpx.post(f"{url}/fleet/requests/s0/move", json={"to": other(source)}, timeout=10)
        assert unauthorised.status_code in (401, 403)
        assert fleetctl("move", "s0", "--to", "prefill-0", "--url", url).returncode != 0
        assert streams.result(timeout=600) == expected[:1]


def running_decode_workers(url: str) -> int:
    workers = httpx.get(f"{url}/fleet/workers", timeout=10).json()["workers"]
    return sum(1 for w in workers if w["role"] == "decode" and w["state"] == "running")


def buffers_of(pids: set[int]) -> list[Path]:
    return [b.path for b in buffers(SHM_DIR) if b.producer_pid in pids]


# (the side that dies, the fault point it dies at): every stage of the move on each side
STAGES = {
    "destination": ["move-reserve", "move-receive", "move-commit"],
    "source": ["move-send", "move-stop", "move-handed-over"],
}


@pytest.mark.parametrize("side", sorted(STAGES))
def test_a_side_dying_in_any_stage_loses_nothing(small_model_dir: Path, expected: list[str], side: str,
                                                 tmp_path: Path) -> None:
    """One stream at a time (a request that fails on three workers is poisoned), moved while the fault
    kills one side at one stage: the stream stays where it was, goes on at the destination, or is
    recomputed, and ends token-identical; the survivors hold no block and no buffer."""
    faults = ",".join(f"{point}@kill-{i}=exit:9*1" for i, point in enumerate(STAGES[side]))
    with serve(small_model_dir, *FLEET, env={"FLEET_FAULTS": faults, "FLEET_FAULTS_DIR": str(tmp_path)}) as url:
        for i, point in enumerate(STAGES[side]):
            request_id = f"kill-{i}"
            stream = start_streams(url, [session(i, request_id)], TOKENS, "small-llama0")
            assert wait_until(lambda rid=request_id: rid in holders(url), 120)
            source = holders(url)[request_id]
            op = move(url, request_id, other(source))
            assert op["state"] in ("done", "failed"), op
            assert stream.result(timeout=600) == expected[i:i + 1], point
            assert (tmp_path / f"{point}@kill-{i}.0").exists(), f"{point} did not fire"
            assert wait_until(lambda: running_decode_workers(url) == 2, 120)  # the dead one restarted
            assert wait_until(lambda: no_blocks_held(url), 30), (point, free_blocks(url))
            assert not buffers_of(set(worker_pids(url).values())), point


def test_drain_move_sends_the_sessions_to_the_peer(small_model_dir: Path, expected: list[str]) -> None:
    """Each step slowed (a fault point's stall) so that decode-0's sessions are still decoding when the drain
    moves them: a fast machine finished them before the drain began."""
    with serve(small_model_dir, *FLEET, env={"FLEET_FAULTS": "step=stall:0.03"}) as url:
        streams = start_streams(url, SESSIONS[:4], TOKENS, "small-llama0")
        assert wait_until(lambda: len(holders(url)) == 4 and "decode-0" in holders(url).values(), 180)
        result = fleetctl("drain", "decode-0", "--move", "--url", url, "--json")
        assert result.returncode == 0, result.stderr
        drained = json.loads(result.stdout)
        assert drained["sessions_moved"] >= 1
        assert not httpx.get(f"{url}/fleet/workers/decode-0/sessions", timeout=10).json()["sessions"]
        assert streams.result(timeout=600) == expected[:4]
        refused = httpx.post(f"{url}/fleet/workers/prefill-0/drain", json={"move": True}, headers=admin(), timeout=10)
        assert refused.status_code == 409


def test_worker_migrate_moves_six_streams_live(small_model_dir: Path, expected: list[str]) -> None:
    """Worker migrate on live moves: the standby on cpu:3 takes every session of decode-0 and its id. Each
    sequence's step is slowed (a fault point's stall) so that the streams outlast the standby's start."""
    with serve(small_model_dir, *FLEET, env={"FLEET_FAULTS": "step=stall:0.03"}) as url:
        streams = start_streams(url, SESSIONS[:6], TOKENS, "small-llama0")
        assert wait_until(lambda: len(holders(url)) == 6, 180)
        result = fleetctl("migrate", "decode-0", "--to", "cpu:3", "--url", url, "--json")
        assert result.returncode == 0, result.stderr
        moved = json.loads(result.stdout)
        assert moved["mode"] == "live" and moved["from"] == "cpu:1" and moved["to"] == "cpu:3"
        assert moved["sessions"] >= 1 and all(mv["downtime_s"] is not None for mv in moved["moves"])
        assert streams.result(timeout=600) == expected[:6]
        workers = {w["id"]: w for w in httpx.get(f"{url}/fleet/workers", timeout=10).json()["workers"]}
        assert workers["decode-0"]["device"] == "cpu:3" and workers["decode-0"]["state"] == "running"
        assert "decode-0-next" not in workers
        assert wait_until(lambda: no_blocks_held(url), 30), free_blocks(url)
