"""Checkpoint, restore and migrate on a real fleet (worker processes on CPU slots, HTTP, the CLI).

Token identity here relies on `--deterministic`: the continuation after a restore (or a cold-start
recompute) must not depend on batch composition."""

import json
import os
import shutil
import signal
import time
from pathlib import Path

import httpx
import pytest
from support.fleet_harness import Stream, admin, fleetctl, generate_json, serve, start_streams, wait_until

from fleetctl.engine.checkpoint.format import MANIFEST, read_checkpoint

pytestmark = pytest.mark.fleet  # real worker processes and a real server

GREEDY = ["The quick brown fox", "Once upon a time there was", "def add(a, b):", "Numbers 0 1 2 3"]
SAMPLED = ["Prefill reads the prompt", "decode writes the answer"]
STREAMS = [*GREEDY, *(Stream(p, temperature=0.9, seed=3) for p in SAMPLED)]
TOKENS = 400
FLEET = ("--prefill", "1", "--decode", "1", "--devices", "cpu:0,cpu:1", "--dtype", "float32", "--deterministic",
         "--kv-blocks", "256")


@pytest.fixture(scope="module")
def expected(small_model_dir: Path) -> list[str]:
    common = ("--dtype", "float32", "--deterministic", "--max-tokens", str(TOKENS), "--ignore-eos")
    greedy = generate_json(small_model_dir, GREEDY, *common)
    sampled = generate_json(small_model_dir, SAMPLED, *common, "--temperature", "0.9", "--seed", "3")
    return [r["text"] for r in greedy + sampled]


def sessions(url: str, worker: str) -> int:
    workers = httpx.get(f"{url}/fleet/workers", timeout=10).json()["workers"]
    return next(w["sessions"] for w in workers if w["id"] == worker)


def operation(url: str, path: str, body: dict) -> dict:
    op = httpx.post(f"{url}{path}", json=body, headers=admin(), timeout=30).json()
    assert "id" in op, op
    return op


def current(url: str, op: dict) -> dict:
    return httpx.get(f"{url}/fleet/operations/{op['id']}", timeout=10).json()


def finished(url: str, op: dict, timeout: float = 600) -> dict:
    deadline = time.monotonic() + timeout
    while op["state"] == "running" and time.monotonic() < deadline:
        time.sleep(0.02)
        op = httpx.get(f"{url}/fleet/operations/{op['id']}", timeout=10).json()
    return op


def test_migrate_decode_worker_mid_stream_is_token_identical(small_model_dir: Path, expected: list[str]) -> None:
    with serve(small_model_dir, *FLEET) as url:
        streams = start_streams(url, STREAMS, TOKENS, "small-llama0")
        assert wait_until(lambda: sessions(url, "decode-0") == len(expected), 60)
        result = fleetctl("migrate", "decode-0", "--to", "cpu:2", "--url", url, "--json")
        assert result.returncode == 0, result.stderr
        moved = json.loads(result.stdout)
        assert moved["mode"] == "live" and moved["reason"] is None and moved["checkpoint"] is None
        assert moved["from"] == "cpu:1" and moved["to"] == "cpu:2" and moved["sessions"] >= 1
        assert streams.result(timeout=300) == expected
        workers = {w["id"]: w for w in httpx.get(f"{url}/fleet/workers", timeout=10).json()["workers"]}
        assert workers["decode-0"]["device"] == "cpu:2" and workers["decode-0"]["state"] == "running"


def test_checkpoint_then_restore_with_tampered_compat_cold_starts(small_model_dir: Path, expected: list[str],
                                                                  fleet_home: Path) -> None:
    with serve(small_model_dir, *FLEET) as url:
        streams = start_streams(url, STREAMS, TOKENS, "small-llama0")
        assert wait_until(lambda: sessions(url, "decode-0") == len(expected), 60)
        done = fleetctl("checkpoint", "decode-0", "--url", url, "--json")
        assert done.returncode == 0, done.stderr
        saved = json.loads(done.stdout)
        path = Path(saved["checkpoint"])
        assert saved["sessions"] >= 1 and path.parent == fleet_home / "checkpoints"
        assert oct(path.stat().st_mode & 0o777) == "0o700"
        assert all(oct(f.stat().st_mode & 0o777) == "0o600" for f in path.iterdir())
        assert not streams.done()  # the sessions are held, their streams open

        corrupt = path.with_name(path.name + "-corrupt")
        shutil.copytree(path, corrupt)
        kv = corrupt / "kv.safetensors"
        data = bytearray(kv.read_bytes())
        data[len(data) // 2] ^= 0xFF
        kv.write_bytes(bytes(data))
        refused = fleetctl("restore", corrupt.name, "--device", "cpu:2", "--url", url)
        assert refused.returncode != 0 and "kv.safetensors" in refused.stderr
        for bad in ("../etc", "/tmp", f"{path.name}/../{path.name}"):
            assert fleetctl("restore", bad, "--device", "cpu:2", "--url", url).returncode != 0
        partial = path.with_name(path.name + "-x.partial")
        shutil.copytree(path, partial)
        assert fleetctl("restore", partial.name, "--device", "cpu:2", "--url", url).returncode != 0
        listed = [c["name"] for c in httpx.get(f"{url}/fleet/checkpoints", timeout=10).json()["checkpoints"]]
        assert partial.name not in listed

        manifest = json.loads((path / MANIFEST).read_text())
        manifest["compat"]["torch"] = "0.0.0-elsewhere"
        (path / MANIFEST).write_text(json.dumps(manifest))
        restored = fleetctl("restore", path.name, "--device", "cpu:2", "--url", url, "--json")
        assert restored.returncode == 0, restored.stderr
        outcome = json.loads(restored.stdout)
        assert outcome["mode"] == "cold-start" and "torch" in outcome["reason"]
        assert streams.result(timeout=300) == expected


def test_a_checkpoint_the_disk_refuses_says_why_and_its_worker_serves_on(small_model_dir: Path, expected: list[str],
                                                                         fleet_home: Path) -> None:
    """The writer fails as on a full disk (the fault point raises the OSError ENOSPC gives, after the KV is written):
    the operation fails with that reason, the worker keeps every session (the streams end exact) and nothing is
    left or listed."""
    with serve(small_model_dir, *FLEET, env={"FLEET_FAULTS": "checkpoint-write=oserror:ENOSPC"}) as url:
        root = fleet_home / "checkpoints"  # this test session's: other tests' checkpoints are there too
        earlier = {p.name for p in root.iterdir()} if root.exists() else set()
        listed = {c["name"] for c in httpx.get(f"{url}/fleet/checkpoints", timeout=10).json()["checkpoints"]}
        streams = start_streams(url, STREAMS, TOKENS, "small-llama0")
        assert wait_until(lambda: sessions(url, "decode-0") == len(expected), 60)
        op = finished(url, operation(url, "/fleet/workers/decode-0/checkpoint", {}))
        assert op["state"] == "failed"
        assert f"No space left on device (ENOSPC) writing {root}; nothing was saved" in op["error"], op["error"]
        workers = {w["id"]: w for w in httpx.get(f"{url}/fleet/workers", timeout=10).json()["workers"]}
        assert workers["decode-0"]["state"] == "running"
        now_listed = {c["name"] for c in httpx.get(f"{url}/fleet/checkpoints", timeout=10).json()["checkpoints"]}
        assert now_listed == listed
        assert ({p.name for p in root.iterdir()} if root.exists() else set()) == earlier
        assert streams.result(timeout=300) == expected


def test_destination_failure_leaves_the_source_serving(small_model_dir: Path, expected: list[str]) -> None:
    with serve(small_model_dir, *FLEET) as url:
        streams = start_streams(url, STREAMS, TOKENS, "small-llama0")
        assert wait_until(lambda: sessions(url, "decode-0") == len(expected), 60)
        op = operation(url, "/fleet/workers/decode-0/migrate", {"to": "cpu:2"})
        assert wait_until(lambda: current(url, op)["destination_pid"] is not None, 30)
        os.kill(current(url, op)["destination_pid"], signal.SIGKILL)
        op = finished(url, op)
        assert op["state"] == "failed" and "nothing was lost" in op["error"]
        assert streams.result(timeout=300) == expected
        workers = {w["id"]: w for w in httpx.get(f"{url}/fleet/workers", timeout=10).json()["workers"]}
        assert workers["decode-0"]["device"] == "cpu:1" and workers["decode-0"]["state"] == "running"


def test_operation_errors_change_nothing(small_model_dir: Path) -> None:
    with serve(small_model_dir, *FLEET) as url:
        cases = [
            ("/fleet/workers/decode-9/migrate", {"to": "cpu:2"}, 404),
            ("/fleet/workers/decode-0/migrate", {"to": "gpu:0"}, 400),
            ("/fleet/workers/decode-0/migrate", {"to": "cuda:7"}, 400),
            ("/fleet/workers/decode-0/migrate", {"to": "cpu:0"}, 409),  # hosts prefill-0
            ("/fleet/workers/decode-0/migrate", {}, 400),
            ("/fleet/restore", {"checkpoint": "../../etc", "device": "cpu:2"}, 400),
            ("/fleet/restore", {"checkpoint": "nope", "device": "cpu:2"}, 404),
        ]
        for path, body, status in cases:
            response = httpx.post(f"{url}{path}", json=body, headers=admin(), timeout=10)
            assert response.status_code == status, (path, body, response.text)
            assert response.json()["error"]["message"]
        first = operation(url, "/fleet/workers/decode-0/migrate", {"to": "cpu:2"})
        again = httpx.post(f"{url}/fleet/workers/decode-0/migrate", json={"to": "cpu:3"}, headers=admin(), timeout=10)
        assert again.status_code == 409
        assert finished(url, first)["state"] == "done"
        assert fleetctl("migrate", "decode-0", "--to", "cpu:0", "--url", url).returncode != 0
        ok = httpx.post(f"{url}/v1/completions", json={"model": "small-llama0", "prompt": "hi", "max_tokens": 3},
                        timeout=60)
        assert ok.status_code == 200


def test_killed_checkpoint_writes_never_leave_a_checkpoint(small_model_dir: Path, fleet_home: Path) -> None:
    """Kill the forked checkpoint writer at several points of a migration (a prefill worker's: it migrates
    through a checkpoint): the migration fails, the source resumes and keeps serving, and nothing incomplete
    is ever listed or accepted. The writer stalls between its data and its manifest (a fault point), so
    every kill lands mid-write; a last migration, not killed, completes."""
    with serve(small_model_dir, *FLEET, env={"FLEET_FAULTS": "checkpoint-write=stall:1.5"}) as url:
        streams = start_streams(url, STREAMS, TOKENS, "small-llama0")
        assert wait_until(lambda: sessions(url, "decode-0") >= 1, 60)
        devices = ["cpu:2", "cpu:3"]
        root = fleet_home / "checkpoints"
        earlier = {p.name for p in root.iterdir()} if root.exists() else set()
        outcomes = []
        for attempt, delay in enumerate((0.0, 0.3, 0.8, None)):
            op = operation(url, "/fleet/workers/prefill-0/migrate", {"to": devices[attempt % 2]})
            assert wait_until(lambda op=op: current(url, op)["writer_pid"] is not None
                              or current(url, op)["state"] != "running", 60)
            if delay is not None:
                time.sleep(delay)
                os.kill(current(url, op)["writer_pid"], signal.SIGKILL)
            op = finished(url, op)
            assert op["state"] in ("done", "failed")
            outcomes.append(op["state"])
            for entry in httpx.get(f"{url}/fleet/checkpoints", timeout=10).json()["checkpoints"]:
                if entry["name"] in earlier:
                    continue
                assert entry["valid"] and not entry["name"].endswith(".partial")
                read_checkpoint(Path(entry["checkpoint"]))
            assert not [p for p in root.glob("*.partial") if p.name not in earlier]
        assert outcomes == ["failed", "failed", "failed", "done"], outcomes
        streams.result(timeout=300)
        ok = httpx.post(f"{url}/v1/completions", json={"model": "small-llama0", "prompt": "hi", "max_tokens": 3},
                        timeout=60)
        assert ok.status_code == 200


@pytest.mark.parametrize("layout", ["prefill", "mixed"])
def test_migrate_prefill_and_mixed_workers(small_model_dir: Path, expected: list[str], layout: str) -> None:
    """A prefill worker and a mixed worker move too (the mixed one live). The prefill worker's decode peer batches two
    sessions at most, so the others stay parked on the prefill worker, KV published: the restored
    worker must publish them again."""
    if layout == "mixed":
        fleet, worker, busy = ("--colocated", "1", "--devices", "cpu:0", "--kv-blocks", "256"), "mixed-0", 6
    else:
        fleet = ("--prefill", "1", "--decode", "1", "--devices", "cpu:0,cpu:1", "--max-num-seqs", "2")
        worker, busy = "prefill-0", 3
    with serve(small_model_dir, *fleet, "--dtype", "float32", "--deterministic") as url:
        streams = start_streams(url, STREAMS, TOKENS, "small-llama0")
        assert wait_until(lambda: sessions(url, worker) >= busy, 60)
        result = fleetctl("migrate", worker, "--to", "cpu:2", "--url", url, "--json")
        assert result.returncode == 0, result.stderr
        # a mixed worker's sessions move live; a prefill worker's (KV awaiting a handoff) go through a checkpoint
        assert json.loads(result.stdout)["mode"] == ("live" if layout == "mixed" else "restored")
        assert streams.result(timeout=300) == expected
