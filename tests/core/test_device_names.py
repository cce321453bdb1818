"""Device names parsed and checked without torch; the GPU count from (simulated) NVML."""


import pynvml
import pytest

from fleetctl.domain import DeviceKind
from fleetctl.engine.core import device_names
from fleetctl.engine.core.device_names import DeviceError, DeviceName, check_device, gpu_count, parse_device_name


@pytest.mark.parametrize(
    ("name", "kind", "index"),
    [
        ("cpu", DeviceKind.CPU, 0),
        ("cpu:3", DeviceKind.CPU, 3),
        ("cuda:1", DeviceKind.CUDA, 1),
        ("cuda:0", DeviceKind.CUDA, 0),
        ("  cuda:12\n", DeviceKind.CUDA, 12),
        ("\tcpu ", DeviceKind.CPU, 0),
    ],
)
def test_parse(name: str, kind: DeviceKind, index: int) -> None:
    assert parse_device_name(name) == DeviceName(kind, index)


def test_str_is_always_indexed() -> None:
    assert str(parse_device_name("cpu")) == "cpu:0"
    assert str(parse_device_name(" cuda:2 ")) == "cuda:2"


def test_indexed_accepts_numbered_names() -> None:
    assert parse_device_name("cpu:0", indexed=True) == DeviceName(DeviceKind.CPU, 0)
    assert parse_device_name("cuda:5", indexed=True) == DeviceName(DeviceKind.CUDA, 5)


def test_indexed_refuses_bare_cpu() -> None:
    with pytest.raises(DeviceError) as exc:
        parse_device_name("cpu", indexed=True)
    assert "'cpu'" in str(exc.value)
    assert "use cpu:N or cuda:N" in str(exc.value)


@pytest.mark.parametrize("name", ["gpu:0", "cuda:", "cpu:-1", "cuda:0:1", "", "CPU", "cuda 0", "cuda:x", "cpu:1.0"])
def test_malformed_names_raise_naming_accepted_forms(name: str) -> None:
    with pytest.raises(DeviceError) as exc:
        parse_device_name(name)
    message = str(exc.value)
    assert repr(name) in message
    assert "cpu, cpu:N or cuda:N" in message


def test_device_error_is_a_value_error() -> None:
    with pytest.raises(ValueError):
        parse_device_name("tpu:0")


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
    monkeypatch.setattr(device_names.pynvml, "nvmlInit", fail)
    monkeypatch.setattr(device_names.pynvml, "nvmlDeviceGetCount", lambda: 4)
    monkeypatch.setattr(device_names.pynvml, "nvmlShutdown", lambda: shutdown.append(True))
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
    monkeypatch.setattr(device_names.pynvml, "nvmlInit", lambda: None)
    monkeypatch.setattr(device_names.pynvml, "nvmlDeviceGetCount", fail)
    monkeypatch.setattr(device_names.pynvml, "nvmlShutdown", lambda: shutdown.append(True))
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    gpu_count.cache_clear()
    try:
        assert gpu_count() == 0
    finally:
        gpu_count.cache_clear()
    assert shutdown == [True]


@pytest.mark.parametrize(("name", "node", "kind", "index"), [
    ("node2/cuda:0", "node2", DeviceKind.CUDA, 0),
    ("node1/cpu:3", "node1", DeviceKind.CPU, 3),
    ("10.0.0.7/cpu:1", "10.0.0.7", DeviceKind.CPU, 1),
    (" gpu-box_2/cuda:7 ", "gpu-box_2", DeviceKind.CUDA, 7),
])
def test_a_ray_node_prefix_names_the_node(name: str, node: str, kind: DeviceKind, index: int) -> None:
    device = parse_device_name(name, indexed=True)
    assert device == DeviceName(kind, index, node)
    assert str(device) == name.strip() and device.local == f"{kind.value}:{index}"


@pytest.mark.parametrize("name", ["/cpu:0", "node2/", "node 2/cpu:0", "a/b/cpu:0", "-x/cpu:0", "node2/cpu"])
def test_malformed_node_prefixes_raise(name: str) -> None:
    with pytest.raises(DeviceError, match=r"use NODE/cpu:N or cuda:N \(NODE: a Ray node's name"):
        parse_device_name(name, indexed=True)


def test_a_named_nodes_gpus_are_not_counted_here(four_gpus: list[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    with pytest.raises(DeviceError, match=r"this machine has 1 CUDA device"):
        check_device("cuda:3")
    assert check_device("node2/cuda:3", indexed=True) == DeviceName(DeviceKind.CUDA, 3, "node2")  # the cluster's
