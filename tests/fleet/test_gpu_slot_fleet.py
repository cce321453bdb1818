"""A prefill/decode fleet on one GPU: the layout accepts a GPU named twice as two slots, gives each worker its
share of the memory, refuses a GPU named whole beside one of its slots, and an operation refuses the same."""

from pathlib import Path

import pytest
from support.fake_workers import FakeLauncher, run_fleet
from support.fleet_checks import finished

from fleetctl.engine.api.operations import OpState
from fleetctl.engine.fleet.controller import Fleet
from fleetctl.engine.fleet.errors import OperationRefused
from fleetctl.engine.fleet.fleet_config import FleetConfig, FleetConfigError, worker_specs


def test_one_gpu_hosts_a_prefill_and_a_decode_worker(four_gpus: list[str], tmp_path: Path) -> None:
    config = FleetConfig(tmp_path, prefill=1, decode=2, devices=("cuda:0", "cuda:0", "cuda:1"), shm_dir=tmp_path)
    assert config.devices == ("cuda:0#0", "cuda:0#1", "cuda:1")
    specs = worker_specs(config)
    assert [(s.worker_id, s.device, s.memory_share) for s in specs] == [
        ("prefill-0", "cuda:0#0", 0.5), ("decode-0", "cuda:0#1", 0.5), ("decode-1", "cuda:1", 1.0)]
    engine = specs[1].engine_config()
    assert (engine.device, engine.memory_share) == ("cuda:0", 0.5)  # torch computes on the GPU itself
    assert all(s.cores == () for s in specs)  # a GPU worker is not pinned to a CPU slot's cores


def test_with_no_devices_named_workers_are_dealt_round_the_gpus_as_slots(four_gpus: list[str], tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("fleetctl.engine.fleet.fleet_config.gpu_count", lambda: 1)  # the one-GPU lab box
    one_gpu = worker_specs(FleetConfig(tmp_path, prefill=1, decode=1, shm_dir=tmp_path))
    assert [(s.worker_id, s.device, s.memory_share) for s in one_gpu] == [
        ("prefill-0", "cuda:0#0", 0.5), ("decode-0", "cuda:0#1", 0.5)]
    monkeypatch.setattr("fleetctl.engine.fleet.fleet_config.gpu_count", lambda: 4)
    six = worker_specs(FleetConfig(tmp_path, prefill=3, decode=3, shm_dir=tmp_path))
    assert [s.device for s in six] == ["cuda:0#0", "cuda:1#0", "cuda:2", "cuda:3", "cuda:0#1", "cuda:1#1"]


def test_beside_cpu_slots_each_gpu_worker_keeps_a_core_of_its_own(four_gpus: list[str], tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """A GPU worker's launches would queue behind the CPU slots' matmuls if the slots pinned every core."""
    monkeypatch.setattr("os.sched_getaffinity", lambda pid: set(range(8)))
    config = FleetConfig(tmp_path, prefill=2, decode=2, devices=("cuda:0", "cuda:0", "cpu:0", "cpu:1"),
                         shm_dir=tmp_path)
    assert {s.device: s.cores for s in worker_specs(config)} == {
        "cuda:0#0": (6,), "cuda:0#1": (7,), "cpu:0": (0, 1, 2), "cpu:1": (3, 4, 5)}
    monkeypatch.setattr("os.sched_getaffinity", lambda pid: {0, 1})  # as many cores as GPU workers: none kept
    assert {s.device: s.cores for s in worker_specs(config)} == {
        "cuda:0#0": (), "cuda:0#1": (), "cpu:0": (0,), "cpu:1": (1,)}


@pytest.mark.parametrize(("devices", "message"), [
    (("cuda:0", "cuda:0#1"), "named whole and as a slot"),
    (("cuda:0#1", "cuda:0#1"), "cuda:0#1 is named twice"),
    (("cpu:0", "cpu:0"), "cpu:0 is named twice"),
    (("cuda:0#0", "cuda:7#0"), "cuda:7#0 does not exist: this machine has 4"),
])
def test_layouts_that_cannot_share_a_device_are_refused(four_gpus: list[str], tmp_path: Path,
                                                        devices: tuple[str, ...], message: str) -> None:
    with pytest.raises(FleetConfigError, match=message):
        FleetConfig(tmp_path, prefill=1, decode=1, devices=devices, shm_dir=tmp_path)


def test_a_worker_started_on_a_split_gpu_takes_a_slot_and_its_share(four_gpus: list[str], tiny_model_dir: Path,
                                                                     tmp_path: Path) -> None:
    async def scenario(fleet: Fleet, launcher: FakeLauncher) -> None:
        with pytest.raises(OperationRefused, match=r"cuda:0 already hosts prefill-0 on cuda:0#0 \(the same GPU") as e:
            fleet.lifecycle.start("decode", "cuda:0")
        assert e.value.status == 409
        with pytest.raises(OperationRefused, match="cuda:0#1 already hosts decode-0"):
            fleet.lifecycle.start("decode", "cuda:0#1")
        op = fleet.lifecycle.start("decode", "cuda:0#2")
        await finished(op)
        assert op.state is OpState.DONE, op.error
        spec = launcher.workers[op.worker_id].spec
        assert (spec.device, spec.memory_share) == ("cuda:0#2", pytest.approx(1 / 3))

    run_fleet(tiny_model_dir, FakeLauncher(tmp_path), scenario, prefill=1, decode=1,
              devices=("cuda:0", "cuda:0"))
