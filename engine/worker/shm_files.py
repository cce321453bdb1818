"""The KV handoff buffers in shared memory: their names, and sweeping the ones nobody will read again.
Torch-free: the workers' transport names them, the controller sweeps them.

    <shm dir>/fleetctl-kv-<fleet pid>-<producer pid>-<id>

The fleet's pid (its controller's) tells a killed fleet's leftovers from a live fleet's buffers; the
producer's pid tells which worker process published one."""

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

SHM_DIR = Path("/dev/shm") if Path("/dev/shm").is_dir() else Path("/tmp")
SHM_PREFIX = "fleetctl-kv-"


@dataclass(frozen=True)
class Buffer:
    path: Path
    fleet_pid: int
    producer_pid: int


def buffer_path(folder: Path, fleet_pid: int, producer_pid: int, unique: str) -> Path:
    return folder / f"{SHM_PREFIX}{fleet_pid}-{producer_pid}-{unique}"


def buffers(folder: Path) -> list[Buffer]:
    """Every handoff buffer in `folder` named as above (others are left alone)."""
    found = []
    for path in folder.glob(f"{SHM_PREFIX}*"):
        fleet, _, rest = path.name.removeprefix(SHM_PREFIX).partition("-")
        producer, _, unique = rest.partition("-")
        if fleet.isdigit() and producer.isdigit() and unique:
            found.append(Buffer(path, int(fleet), int(producer)))
    return found


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)  # no signal is sent: only whether the process exists
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # someone else's process
    return True


def sweep(folder: Path, doomed: Callable[[Buffer], bool]) -> int:
    """Remove the buffers `doomed` picks; returns how many were removed."""
    removed = 0
    for buffer in buffers(folder):
        if doomed(buffer):
            buffer.path.unlink(missing_ok=True)
            removed += 1
    return removed


def sweep_dead_fleets(folder: Path) -> int:
    """Buffers left by fleets that were killed (their controller is gone): nobody will read them."""
    return sweep(folder, lambda buffer: not pid_alive(buffer.fleet_pid))
