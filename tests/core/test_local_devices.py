"""Device names checked against this machine's GPUs; the GPU count from (simulated) NVML."""

import pynvml
import pytest

from fleetctl.domain import DeviceKind
from fleetctl.engine.api.device_names import DeviceError, DeviceName
from fleetctl.engine.core import local_devices
from fleetctl.engine.core.local_devices import check_device, gpu_count


def test_check_device_accepts_cpu_without_gpus() -> None:
    assert check_device("cpu:7") == DeviceName(DeviceKind.CPU, 7)
    assert check_device("cpu") == DeviceName(DeviceKind.CPU, 0)
    with pytest.raises(DeviceError, match="cpu:N or cuda:N"):
        check_device("cpu", indexed=True)


def test_check_device_rejects_a_cuda_index_that_does_not_exist() -> None:
    count = gpu_count()
    if count > 0:
        pytest.skip("needs a machine without CUDA (this one has CUDA devices)")
    with pytest.raises(DeviceError) as exc:
        check_device(f"cuda:{count}")
    assert "cuda:0 does not exist" in str(exc.value)
    assert "has 0 CUDA device(s)" in str(exc.value)


@pytest.mark.parametrize(
    ("visible", "expected"),
    [("", 0), ("0,2", 2), ("1,-1,2", 1), ("3", 1), ("0,1,2,3,4,5", 4), (" 0 , 1 ", 2), ("0,,1", 1)],
)
def test_gpu_count_honours_cuda_visible_devices(
    four_gpus: list[str], monkeypatch: pytest.MonkeyPatch, visible: str, expected: int
) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
    assert gpu_count() == expected
    assert four_gpus == ["init", "count", "shutdown"]


def test_gpu_count_without_cuda_visible_devices(four_gpus: list[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    assert gpu_count() == 4
    assert gpu_count() == 4
    assert four_gpus == ["init", "count", "shutdown"]  # cached: NVML asked once


def test_check_device_against_simulated_gpus(four_gpus: list[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,2")
    assert check_device("cuda:1") == DeviceName(DeviceKind.CUDA, 1)
    with pytest.raises(DeviceError, match=r"cuda:2 does not exist: this machine has 2 CUDA device\(s\)"):
        check_device("cuda:2", indexed=True)


def test_gpu_count_is_zero_when_nvml_cannot_start(monkeypatch: pytest.MonkeyPatch) -> None:
    def fail() -> None:
        raise pynvml.NVMLError(pynvml.NVML_ERROR_LIBRARY_NOT_FOUND)

    shutdown: list[bool] = []
    monkeypatch.setattr(local_devices.pynvml, "nvmlInit", fail)
    monkeypatch.setattr(local_devices.pynvml, "nvmlDeviceGetCount", lambda: 4)
    monkeypatch.setattr(local_devices.pynvml, "nvmlShutdown", lambda: shutdown.append(True))
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    gpu_count.cache_clear()
    try:
        assert gpu_count() == 0
    finally:
        gpu_count.cache_clear()
    assert shutdown == []  # never initialised, so nothing to shut down


def test_gpu_count_is_zero_and_shuts_down_when_count_fails(monkeypatch: pytest.MonkeyPatch) -> None:
    def fail() -> int:
        raise pynvml.NVMLError(pynvml.NVML_ERROR_UNKNOWN)

    shutdown: list[bool] = []
    monkeypatch.setattr(local_devices.pynvml, "nvmlInit", lambda: None)
    monkeypatch.setattr(local_devices.pynvml, "nvmlDeviceGetCount", fail)
    monkeypatch.setattr(local_devices.pynvml, "nvmlShutdown", lambda: shutdown.append(True))
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    gpu_count.cache_clear()
    try:
        assert gpu_count() == 0
    finally:
        gpu_count.cache_clear()
    assert shutdown == [True]


def test_a_named_nodes_gpus_are_not_counted_here(four_gpus: list[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    with pytest.raises(DeviceError, match=r"this machine has 1 CUDA device"):
        check_device("cuda:3")
    assert check_device("node2/cuda:3", indexed=True) == DeviceName(DeviceKind.CUDA, 3, "node2")  # the cluster's
