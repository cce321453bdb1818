"""Fault points for tests and chaos runs. `FLEET_FAULTS="<point>=<action>,…"` in a process's
environment (workers inherit the server's) makes `fault_point(<point>)` misbehave right there:

    stall:S   sleep S seconds (a hung or slow step)
    exit:C    leave the process at once with code C (a crash; no cleanup runs)
    raise     raise InjectedFault (an exception in the code under test)

Without the variable a fault point is one dictionary lookup."""

import os
import time
from functools import cache


class InjectedFault(RuntimeError):
    pass


@cache
def _parse(spec: str) -> dict[str, str]:
    pairs = (item.split("=", 1) for item in spec.split(",") if "=" in item)
    return {point.strip(): action.strip() for point, action in pairs}


def fault_point(point: str) -> None:
    action = _parse(os.environ.get("FLEET_FAULTS", "")).get(point)
    if action is None:
        return
    kind, _, argument = action.partition(":")
    if kind == "stall":
        time.sleep(float(argument or 1.0))
    elif kind == "exit":
        os._exit(int(argument or 1))
    elif kind == "raise":
        raise InjectedFault(f"fault injected at {point}")
    else:
        raise ValueError(f"FLEET_FAULTS: unknown action {action!r} for {point}")
