"""A fleet's worker specs: `--dtype auto` resolved once for the whole fleet, so that every worker computes
its KV in the dtype every other one can adopt; and each role's weight format (--prefill-quantization,
--decode-quantization over --quantization)."""

from pathlib import Path

import pytest

from fleetctl.domain import Quantization, WorkerRole
from fleetctl.engine.core import auto_dtype, local_devices
from fleetctl.engine.core.engine_settings import DType, EngineSettings
from fleetctl.engine.fleet.fleet_config import FleetConfig, FleetConfigError, worker_specs
from fleetctl.engine.planner.autoplan_settings import AutoplanSettings


@pytest.fixture(autouse=True)
def two_gpus(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(local_devices, "gpu_count", lambda: 2)


def dtypes(tmp_path: Path, devices: tuple[str, ...], dtype: DType = DType.AUTO) -> set[DType]:
    config = FleetConfig(tmp_path, prefill=1, decode=len(devices) - 1, devices=devices,
                         engine=EngineSettings(dtype=dtype))
    return {spec.engine.dtype for spec in worker_specs(config)}


@pytest.mark.parametrize(("cpu_native", "expected"), [(False, DType.FLOAT32), (True, DType.BFLOAT16)])
def test_auto_is_one_dtype_for_a_gpu_and_cpu_fleet(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                                   cpu_native: bool, expected: DType) -> None:
    monkeypatch.setattr(auto_dtype, "cpu_has_native_bf16", lambda: cpu_native)
    assert dtypes(tmp_path, ("cuda:0", "cpu:0", "cuda:1")) == {expected}


def test_auto_on_gpus_alone_is_bf16(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(auto_dtype, "cpu_has_native_bf16", lambda: False)
    assert dtypes(tmp_path, ("cuda:0", "cuda:1")) == {DType.BFLOAT16}


def test_another_nodes_cpu_counts_as_not_native(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(auto_dtype, "cpu_has_native_bf16", lambda: True)  # this machine's, not node2's
    assert dtypes(tmp_path, ("cuda:0", "node2/cpu:0")) == {DType.FLOAT32}


def test_a_dtype_given_is_kept(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(auto_dtype, "cpu_has_native_bf16", lambda: False)
    assert dtypes(tmp_path, ("cuda:0", "cpu:0"), DType.FLOAT16) == {DType.FLOAT16}


def test_each_role_loads_its_own_weight_format(tmp_path: Path) -> None:
    config = FleetConfig(tmp_path, prefill=1, decode=2, engine=EngineSettings(quantization=Quantization.INT8),
                         role_quantization=((WorkerRole.DECODE, Quantization.INT4),))
    formats = {spec.worker_id: spec.engine.quantization for spec in worker_specs(config)}
    assert formats == {"prefill-0": Quantization.INT8, "decode-0": Quantization.INT4, "decode-1": Quantization.INT4}
    assert config.quantization_for(WorkerRole.PREFILL) is Quantization.INT8


def test_a_format_for_a_role_the_fleet_lacks_is_refused(tmp_path: Path) -> None:
    with pytest.raises(FleetConfigError, match="a weight format for decode workers, which this fleet has none of"):
        FleetConfig(tmp_path, colocated=2, role_quantization=((WorkerRole.DECODE, Quantization.INT4),))


def test_devices_beyond_the_workers_are_the_pools_free_ones(tmp_path: Path) -> None:
    config = FleetConfig(tmp_path, prefill=1, decode=1, devices=("cpu:0", "cpu:1", "cpu:2", "cpu:3"),
                         store_path=tmp_path / "fleet.db", autoplan=AutoplanSettings(max_workers=4))
    assert config.pool == ("cpu:0", "cpu:1", "cpu:2", "cpu:3")
    assert [(s.worker_id, s.device) for s in worker_specs(config)] == [("prefill-0", "cpu:0"), ("decode-0", "cpu:1")]
    with pytest.raises(FleetConfigError, match=r"1 devices given for 2 workers: give one each"):
        FleetConfig(tmp_path, prefill=1, decode=1, devices=("cpu:0",))
    for limit in (1, 5):
        with pytest.raises(FleetConfigError, match=rf"--max-workers {limit} must be between the fleet's 2 workers "
                                                   r"and the 4 devices of --devices \(cpu:0, cpu:1, cpu:2, cpu:3\)"):
            FleetConfig(tmp_path, prefill=1, decode=1, devices=config.pool, store_path=tmp_path / "fleet.db",
                        autoplan=AutoplanSettings(max_workers=limit))
