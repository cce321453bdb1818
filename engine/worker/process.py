"""A worker process's entry point. Importing this module costs nothing (no torch): the launcher in the
controller names `worker_main` as the spawn target, and only the child imports the engine."""

import contextlib
import os
import signal
import sys
import traceback
from multiprocessing.connection import Connection
from pathlib import Path

from fleetctl.engine.worker import protocol as m
from fleetctl.engine.worker.spec import WorkerSpec


def worker_main(spec: WorkerSpec, conn: Connection) -> None:
    """Process entry point (multiprocessing spawn): pin to the slot's cores, run the loop, then leave at once.
    The loop has released what the worker published by then; the interpreter's own teardown is skipped, as
    torch's takes seconds (more with several workers exiting together), which made every stop that long."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the controller's: it drains and stops workers
    if spec.log_path is not None:
        _write_output_to(spec.log_path)
    if spec.cores:
        os.sched_setaffinity(0, spec.cores)
    served = run_worker(spec, conn)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0 if served else 1)


def _write_output_to(path: Path) -> None:
    """This process's stdout and stderr — Python's and any library's, a crash's last words too — appended to
    `path`, a line at a time (engine/fleet/logs.py reads it)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    sys.stdout.reconfigure(line_buffering=True)


def run_worker(spec: WorkerSpec, conn: Connection, transport: object | None = None) -> bool:
    """Import the engine and run the worker's loop on `conn` (a local pipe, or a Ray actor's socket; the
    actor passes its KV transport). False when the worker could not go on: it said why in one line
    (the controller reports it); FLEET_DEBUG=1 adds the traceback."""
    try:
        import torch

        from fleetctl.engine.core.torch_devices import make_current
        from fleetctl.engine.worker.loop import Worker

        make_current(spec.engine_config().device)  # before any CUDA work: kernels launch on the current device
        torch.set_num_threads(max(1, len(spec.cores) or torch.get_num_threads()))
        conn.send(m.WorkerLoading(spec.worker_id, os.getpid()))
        Worker(spec, conn, transport).run()
    except Exception as exc:
        if os.environ.get("FLEET_DEBUG"):
            traceback.print_exc()
        with contextlib.suppress(OSError, ValueError):
            conn.send(m.WorkerFailed(spec.worker_id, f"{type(exc).__name__}: {exc}"))
        return False
    return True
