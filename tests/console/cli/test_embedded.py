"""The embedded fleet's layout on this machine's devices (`fleetctl demo`, later the console)."""

from pathlib import Path

import pytest

from fleetctl.console.cli.embedded import embedded_fleet_args
from fleetctl.engine.core import local_devices


@pytest.mark.parametrize(("gpus", "layout"), [
    (0, ["--prefill", "1", "--decode", "2", "--devices", "cpu:0,cpu:1,cpu:2"]),
    (1, ["--prefill", "1", "--decode", "1", "--devices", "cuda:0,cuda:0"]),  # two slots of the one GPU
    (2, ["--prefill", "1", "--decode", "1", "--devices", "cuda:0,cuda:1"]),
    (8, ["--prefill", "1", "--decode", "7", "--devices", ",".join(f"cuda:{i}" for i in range(8))]),
])
def test_one_worker_per_device_one_of_them_prefill(monkeypatch: pytest.MonkeyPatch, gpus: int,
                                                   layout: list[str]) -> None:
    monkeypatch.setattr(local_devices, "gpu_count", lambda: gpus)
    assert embedded_fleet_args(Path("/s/fleet.db")) == [*layout, "--grace", "4", "--store", "/s/fleet.db"]


def test_the_store_defaults_to_fleet_home(fleet_home: Path) -> None:
    assert embedded_fleet_args()[-2:] == ["--store", str(fleet_home / "fleet.db")]
