"""Fault points for tests and chaos runs. `FLEET_FAULTS="<point>[@<key>]=<action>[*<n>],…"` in a process's
environment (workers inherit the server's) makes `fault_point(<point>, key)` misbehave right there:

    stall:S   sleep S seconds (a hung or slow step)
    exit:C    leave the process at once with code C (a crash; no cleanup runs)
    raise     raise InjectedFault (an exception in the code under test)
    raise:M   raise InjectedFault with message M (one that reads as a CUDA error poisons the device)
    oserror:E raise the OSError a full or failing disk gives, E an errno name (ENOSPC, EIO, EROFS)

`@<key>` narrows a fault to calls whose key (a request id, where the point has one) contains <key>, so a
test can poison exactly one request (the server takes a client's `X-Request-Id`). `*<n>` lets the fault
fire at most n times in all the processes of a fleet together, counted with marker files created in
`$FLEET_FAULTS_DIR` (which it then needs): "kill the decode worker once", not every worker after it.

Without the variable a fault point is one dictionary lookup."""

import errno
import os
import time
from dataclasses import dataclass
from functools import cache
from pathlib import Path


class InjectedFault(RuntimeError):
    pass


@dataclass(frozen=True)
class Fault:
    point: str
    key: str  # "" matches every call
    action: str
    times: int  # 0: unlimited


@cache
def _parse(spec: str) -> dict[str, tuple[Fault, ...]]:
    faults: dict[str, list[Fault]] = {}
    for item in (item for item in spec.split(",") if "=" in item):
        target, action = (part.strip() for part in item.split("=", 1))
        action, _, times = action.partition("*")
        point, _, key = target.partition("@")
        faults.setdefault(point, []).append(Fault(point, key, action, int(times or 0)))
    return {point: tuple(found) for point, found in faults.items()}


def fault_point(point: str, key: str = "") -> None:
    for fault in _parse(os.environ.get("FLEET_FAULTS", "")).get(point, ()):
        if fault.key in key and (not fault.times or _claim(fault)):
            _fire(fault)


def _claim(fault: Fault) -> bool:
    """One of the fault's n firings, if any is left (atomic across processes)."""
    folder = os.environ.get("FLEET_FAULTS_DIR")
    if not folder:
        raise ValueError(f"FLEET_FAULTS: {fault.point} fires *{fault.times}: set FLEET_FAULTS_DIR to count them")
    for firing in range(fault.times):
        try:
            os.close(os.open(Path(folder) / f"{fault.point}@{fault.key}.{firing}", os.O_CREAT | os.O_EXCL, 0o600))
        except FileExistsError:
            continue
        return True
    return False


def _fire(fault: Fault) -> None:
    kind, _, argument = fault.action.partition(":")
    if kind == "stall":
        time.sleep(float(argument or 1.0))
    elif kind == "exit":
        os._exit(int(argument or 1))
    elif kind == "raise":
        raise InjectedFault(argument or f"fault injected at {fault.point}")
    elif kind == "oserror":
        code = getattr(errno, argument)
        raise OSError(code, os.strerror(code))
    else:
        raise ValueError(f"FLEET_FAULTS: unknown action {fault.action!r} for {fault.point}")
