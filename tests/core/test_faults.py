"""Fault points: a fault narrowed to one request id, and one that fires a counted number of times across
processes (marker files in $FLEET_FAULTS_DIR)."""

import multiprocessing as mp
from pathlib import Path

import pytest

from fleetctl.engine.core import faults
from fleetctl.engine.core.faults import InjectedFault, fault_point


def test_no_faults_configured_does_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    """Once the variable is gone the same fault point neither raises, stalls nor exits."""
    actions: list[str] = []
    monkeypatch.setattr(faults.time, "sleep", lambda seconds: actions.append(f"stall {seconds}"))
    monkeypatch.setattr(faults.os, "_exit", lambda code: actions.append(f"exit {code}"))
    monkeypatch.setenv("FLEET_FAULTS", "step=stall:2,step=exit:3,step=raise")
    with pytest.raises(InjectedFault):
        fault_point("step", "req-1")
    assert actions == ["stall 2.0", "exit 3"]
    actions.clear()
    monkeypatch.delenv("FLEET_FAULTS")
    for point in ("step", "publish", "adopt"):
        fault_point(point, "req-1")
    assert actions == []


def test_a_keyed_fault_hits_only_matching_requests(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FLEET_FAULTS", "step@poison=raise,adopt=raise")
    fault_point("step", "req-healthy")
    fault_point("publish", "poison-1")
    with pytest.raises(InjectedFault, match="fault injected at step"):
        fault_point("step", "chaos-poison-1")
    with pytest.raises(InjectedFault, match="at adopt"):
        fault_point("adopt", "anything")


def test_a_raised_fault_can_say_what(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FLEET_FAULTS", "step=raise:CUDA error: an illegal memory access was encountered")
    with pytest.raises(InjectedFault) as raised:
        fault_point("step", "req-1")
    assert str(raised.value) == "CUDA error: an illegal memory access was encountered"


def _fire(_: int) -> bool:
    try:
        fault_point("step", "req-x")
    except InjectedFault:
        return True
    return False


def test_a_counted_fault_fires_that_many_times_across_processes(monkeypatch: pytest.MonkeyPatch,
                                                                 tmp_path: Path) -> None:
    monkeypatch.setenv("FLEET_FAULTS", "step@req=raise*2")
    monkeypatch.setenv("FLEET_FAULTS_DIR", str(tmp_path))
    with mp.get_context("spawn").Pool(3) as pool:
        assert sum(pool.map(_fire, range(6))) == 2
    assert not _fire(0)


def test_a_counted_fault_needs_a_directory(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FLEET_FAULTS", "step=raise*1")
    monkeypatch.delenv("FLEET_FAULTS_DIR", raising=False)
    with pytest.raises(ValueError, match="FLEET_FAULTS_DIR"):
        fault_point("step")
