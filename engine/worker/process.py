"""A worker process's entry point. Importing this module costs nothing (no torch): the launcher in the
controller names `worker_main` as the spawn target, and only the child imports the engine."""

import os
from multiprocessing.connection import Connection

from fleetctl.engine.worker import protocol as m
from fleetctl.engine.worker.spec import WorkerSpec


def worker_main(spec: WorkerSpec, conn: Connection) -> None:
    """Process entry point (multiprocessing spawn): pin to the slot's cores, then run the loop."""
    if spec.cores:
        os.sched_setaffinity(0, spec.cores)
    import torch

    from fleetctl.engine.worker.loop import Worker

    torch.set_num_threads(max(1, len(spec.cores) or torch.get_num_threads()))
    conn.send(m.WorkerLoading(spec.worker_id, os.getpid()))
    Worker(spec, conn).run()
