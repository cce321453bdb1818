"""How requests end on a real fleet when their clients leave or the fleet shuts down: a client that goes away
(streaming or not, decoding or with its KV still parked for a handoff) frees the work — every worker's KV
blocks come back and no handoff buffer is left in /dev/shm; SIGTERM drains (503 for new requests, the grace
for running ones, one clear error for the rest) and leaves no buffer behind; a killed fleet's buffers are
swept when the next one starts."""

import asyncio
import os
import signal
import subprocess
import threading
import time
from pathlib import Path

import httpx
import pytest
from support.fleet_harness import serve, wait_until

from fleetctl.engine.worker.shm_files import SHM_DIR, buffer_path, buffers

pytestmark = pytest.mark.fleet  # real worker processes and a real server

# one sequence per worker batch: further requests wait on the prefill worker, their KV published
FLEET = ("--prefill", "1", "--decode", "1", "--devices", "cpu:0,cpu:1", "--dtype", "float32", "--max-num-seqs", "1",
         "--kv-blocks", "64")


def status(url: str) -> dict:
    return httpx.get(f"{url}/fleet/status", timeout=10).json()


def fleet_buffers(pid: int) -> list[Path]:
    return [b.path for b in buffers(SHM_DIR) if b.fleet_pid == pid]


def all_blocks_free(url: str) -> bool:
    return all(w["free_blocks"] == w["kv_blocks"] for w in status(url)["workers"])


async def leave(url: str, model: str, until_left, request_ids: list[str], blocking: str) -> None:
    """Streaming clients and one non-streaming client that go away (their tasks cancelled: the connection
    closes) once `until_left()` says so."""
    async def consume(http: httpx.AsyncClient, request_id: str) -> None:
        body = {"model": model, "prompt": "Once upon a time", "max_tokens": 400, "stream": True, "ignore_eos": True}
        async with http.stream("POST", f"{url}/v1/completions", json=body,
                               headers={"X-Request-Id": request_id}) as response:
            async for _ in response.aiter_lines():
                pass

    async with httpx.AsyncClient(timeout=120) as http:
        tasks = [asyncio.create_task(consume(http, rid)) for rid in request_ids]
        tasks.append(asyncio.create_task(http.post(
            f"{url}/v1/completions", json={"model": model, "prompt": "Hello there", "max_tokens": 400,
                                           "ignore_eos": True}, headers={"X-Request-Id": blocking})))
        assert await asyncio.to_thread(wait_until, until_left, 60)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


def test_clients_that_leave_free_their_kv_and_handoff_buffers(small_model_dir: Path) -> None:
    with serve(small_model_dir, *FLEET) as url:
        pid, model = status(url)["pid"], small_model_dir.name
        ids = ["s0", "s1", "s2", "s3"]
        # one decoding, the others prefilled with their KV parked for a handoff (or still waiting to prefill)
        asyncio.run(leave(url, model, lambda: status(url)["pools"]["decode"]["queue"] >= 2 and fleet_buffers(pid),
                          ids, "blocking"))
        assert wait_until(lambda: not status(url)["pools"]["decode"]["queue"] and all_blocks_free(url), 30), \
            status(url)["workers"]
        assert wait_until(lambda: not fleet_buffers(pid), 10), fleet_buffers(pid)
        records = {r["request_id"]: r for r in httpx.get(f"{url}/fleet/requests", timeout=10).json()["requests"]}
        assert {records[rid]["outcome"] for rid in [*ids, "blocking"]} == {"abort"}
        assert all(records[rid]["output_tokens"] < 400 for rid in [*ids, "blocking"])


def test_sigterm_drains_then_stops_and_leaves_no_buffer(small_model_dir: Path) -> None:
    dead = subprocess.Popen(["true"])
    dead.wait()
    stale = buffer_path(SHM_DIR, dead.pid, dead.pid, "left-by-a-killed-fleet")
    stale.write_bytes(b"kv")
    # every step that runs a long request takes 50 ms more: they cannot finish within the grace, short ones can
    layout = ("--prefill", "1", "--decode", "1", "--devices", "cpu:0,cpu:1", "--dtype", "float32", "--grace", "6")
    with serve(small_model_dir, *layout, env={"FLEET_FAULTS": "step@long=stall:0.05"}) as url:
        assert not stale.exists()  # swept as the fleet started
        pid, model = status(url)["pid"], small_model_dir.name
        workers = [w["pid"] for w in status(url)["workers"]]
        results: dict[str, list[str]] = {}
        admitted: dict[str, int] = {}  # request id -> HTTP status, once its response began

        def client(request_id: str, tokens: int) -> None:
            body = {"model": model, "prompt": "Numbers 0 1 2", "max_tokens": tokens, "stream": True,
                    "ignore_eos": True}
            with httpx.stream("POST", f"{url}/v1/completions", json=body, headers={"X-Request-Id": request_id},
                              timeout=120) as response:
                admitted[request_id] = response.status_code
                results[request_id] = [line for line in response.iter_lines() if line.startswith("data: ")]

        threads = [threading.Thread(target=client, args=(rid, tokens))
                   for rid, tokens in (("short-0", 8), ("short-1", 8), ("long-0", 900), ("long-1", 900))]
        for thread in threads:
            thread.start()
        # all four admitted (on a loaded machine a client may not have connected yet) and one decoding
        assert wait_until(lambda: len(admitted) == 4 and status(url)["workers"][1]["sessions"] >= 1, 60), admitted
        assert set(admitted.values()) == {200}, admitted
        os.kill(pid, signal.SIGTERM)
        refused = None
        deadline = time.monotonic() + 10
        while refused is None and time.monotonic() < deadline:
            answer = httpx.post(f"{url}/v1/completions", json={"model": model, "prompt": "hi", "max_tokens": 2},
                                timeout=10)
            refused = answer if answer.status_code == 503 else None
        assert refused is not None and refused.json()["error"]["message"] == "the fleet is shutting down"
        for thread in threads:
            thread.join(60)
        for rid in ("short-0", "short-1"):
            assert results[rid][-1] == "data: [DONE]" and '"finish_reason": "length"' in results[rid][-2]
        for rid in ("long-0", "long-1"):
            assert results[rid][-1] == "data: [DONE]"
            assert "the fleet shut down before this request finished (3 s grace)" in results[rid][-2]
    assert wait_until(lambda: not any(Path(f"/proc/{p}").exists() for p in [pid, *workers]), 30)  # reaped
    assert not fleet_buffers(pid)
