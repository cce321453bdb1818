"""`fleetctl serve` quits within its --grace after SIGTERM or SIGINT, counted from the signal until neither it
nor any worker runs and no handoff buffer of its is left, even with streams in flight that cannot finish and
their KV parked for a decode worker stuck adopting it (it must be killed). The default grace, 20 s, leaves room
under Kubernetes' 30 s before SIGKILL."""

import os
import signal
import time
from pathlib import Path

import httpx
import pytest
from support.fleet_harness import serve, start_streams, wait_until
from support.quitting import process_tree, seconds_until_all_gone

from fleetctl.engine.fleet.shutdown_budget import DEFAULT_GRACE_S
from fleetctl.engine.worker.shm_files import SHM_DIR, buffers

pytestmark = [pytest.mark.fleet, pytest.mark.slow]
FLEET = ("--prefill", "1", "--decode", "1", "--devices", "cpu:0,cpu:1", "--dtype", "float32")
STUCK_ADOPTING = {"FLEET_FAULTS": "adopt=stall:600"}  # the decode worker never takes the KV: it stays parked


@pytest.mark.parametrize(("sig", "grace"), [(signal.SIGTERM, None), (signal.SIGINT, 8.0)], ids=["SIGTERM", "SIGINT"])
def test_serve_quits_within_its_grace_with_streams_in_flight_and_handoffs_parked(
        tiny_model_dir: Path, sig: signal.Signals, grace: float | None) -> None:
    grace_option = ("--grace", f"{grace:g}") if grace is not None else ()  # None: the default
    with serve(tiny_model_dir, *FLEET, *grace_option, env=STUCK_ADOPTING) as url:
        pid = httpx.get(f"{url}/fleet/status", timeout=10).json()["pid"]
        streams = start_streams(url, [f"Numbers {i} 1 2" for i in range(3)], max_tokens=200)
        assert wait_until(lambda: any(b.fleet_pid == pid for b in buffers(SHM_DIR)), 60), "no handoff parked"
        fleet = process_tree(pid)  # the server, its workers, multiprocessing's resource tracker
        signalled = time.monotonic()
        for process in fleet:  # as Ctrl-C does: the whole process group (workers ignore SIGINT)
            os.kill(process.pid, sig)
            if sig is signal.SIGTERM:
                break
        took = seconds_until_all_gone(fleet, signalled, timeout=60)
    assert took <= (grace or DEFAULT_GRACE_S), f"{took:.1f} s"
    with pytest.raises(Exception):  # noqa: B017 - the streams ended with the fleet's error, however it reads
        streams.result(10)
