"""Shutting a fleet down (fake workers): new requests are refused at once, running ones finish within the
grace and the rest end with one clear error; no KV buffer in shared memory survives the fleet, and a
killed fleet's buffers are swept when the next one starts."""

import asyncio
import os
import subprocess
from pathlib import Path

import pytest
from support.fake_workers import FakeLauncher, run_fleet
from support.fleet_checks import ends, prompts, shm, until

from fleetctl.engine.core.sequence import SamplingParams
from fleetctl.engine.fleet.admission import FleetClosing
from fleetctl.engine.fleet.controller import Fleet
from fleetctl.engine.worker.shm_files import buffer_path

PARAMS = SamplingParams(max_tokens=30, temperature=0.0, ignore_eos=True)


def test_drain_refuses_new_requests_finishes_what_it_can_and_ends_the_rest(tiny_model_dir: Path,
                                                                           tmp_path: Path) -> None:
    endless = SamplingParams(max_tokens=100_000, temperature=0.0, ignore_eos=True)

    async def scenario(fleet: Fleet, launcher: FakeLauncher) -> None:
        short = [fleet.submit(p, PARAMS) for p in prompts(3)]
        stuck = fleet.submit([9, 9, 9], endless)
        draining = asyncio.create_task(fleet.drain(0.5))
        await asyncio.sleep(0)
        with pytest.raises(FleetClosing, match="shutting down"):
            fleet.submit([1, 2, 3], PARAMS)
        errors = await ends(fleet, [*short, stuck])
        await draining
        assert errors.pop(stuck.request_id) == "the fleet shut down before this request finished (0.5 s grace)"
        assert set(errors.values()) == {None}
        await until(lambda: not any(w.sessions for w in launcher.workers.values()))

    run_fleet(tiny_model_dir, FakeLauncher(shm(tmp_path)), scenario)


def test_no_buffer_outlives_the_fleet_and_a_killed_fleets_are_swept(tiny_model_dir: Path, tmp_path: Path) -> None:
    folder = shm(tmp_path)
    gone = subprocess.Popen(["true"])
    gone.wait()
    killed_fleet = buffer_path(folder, gone.pid, gone.pid, "left-behind")
    live_fleet = buffer_path(folder, os.getppid(), os.getppid(), "in-use")  # another fleet, still running
    for path in (killed_fleet, live_fleet):
        path.write_bytes(b"kv")
    unannounced = buffer_path(folder, os.getpid(), 12345, "never-announced")  # a worker of ours died publishing

    async def scenario(fleet: Fleet, launcher: FakeLauncher) -> None:
        assert not killed_fleet.exists() and live_fleet.exists()
        unannounced.write_bytes(b"kv")
        reqs = [fleet.submit(p, PARAMS) for p in prompts(3)]
        assert set((await ends(fleet, reqs)).values()) == {None}

    run_fleet(tiny_model_dir, FakeLauncher(folder), scenario)
    assert sorted(p.name for p in folder.iterdir()) == [live_fleet.name]
