"""Device names parsed without torch: the forms a name may take, slots, node prefixes."""

import pytest

from fleetctl.domain import DeviceKind
from fleetctl.engine.api.device_names import DeviceError, DeviceName, parse_device_name
from fleetctl.errors import UserError


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


def test_device_error_is_a_user_error() -> None:
    with pytest.raises(UserError):
        parse_device_name("tpu:0")


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
