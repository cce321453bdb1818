"""GPU slots: several workers on one GPU (`cuda:0#0`, `cuda:0#1`, or the GPU named twice), each sizing its KV
pool by its share of the GPU's memory."""

import pytest

from fleetctl.domain import DeviceKind
from fleetctl.engine.api.device_names import (
    DeviceError,
    DeviceName,
    gpu_clash,
    gpu_slots,
    memory_share,
    parse_device_name,
)
from fleetctl.engine.core.engine_settings import DEFAULT_CPU_KV_BYTES, GPU_KV_FRACTION
from fleetctl.engine.core.torch_devices import kv_budget


def test_a_slot_names_its_gpu_and_computes_on_the_gpu_itself() -> None:
    slot = parse_device_name("cuda:1#2", indexed=True)
    assert slot == DeviceName(DeviceKind.CUDA, 1, slot=2)
    assert (str(slot), slot.physical, slot.gpu_key) == ("cuda:1#2", "cuda:1", ("", 1))
    on_node = parse_device_name("node2/cuda:0#1")
    assert (str(on_node), on_node.local, on_node.physical) == ("node2/cuda:0#1", "cuda:0#1", "cuda:0")
    assert parse_device_name("cuda:0").slot is None


@pytest.mark.parametrize("name", ["cpu:0#1", "cuda#1", "cuda:0#", "cuda:0#x"])
def test_malformed_slots_are_refused(name: str) -> None:
    with pytest.raises(DeviceError, match="unknown device"):
        parse_device_name(name, indexed=True)


def test_a_gpu_named_twice_becomes_its_slots_in_order() -> None:
    assert gpu_slots(["cuda:0", "cuda:1", "cuda:0", "cpu:0"]) == ("cuda:0#0", "cuda:1", "cuda:0#1", "cpu:0")
    assert gpu_slots(["cuda:0#1", "cuda:0#0"]) == ("cuda:0#1", "cuda:0#0")  # named slots stay as named
    assert gpu_slots(["cpu:0", "cpu:0"]) == ("cpu:0", "cpu:0")  # a CPU slot is not split (the fleet refuses it)


def test_each_slot_takes_an_even_share_and_a_whole_gpu_all_of_it() -> None:
    fleet = ["cuda:0#0", "cuda:0#1", "cuda:0#2", "cuda:1", "cpu:0"]
    assert [memory_share(d, fleet) for d in fleet] == pytest.approx([1 / 3, 1 / 3, 1 / 3, 1.0, 1.0])
    assert memory_share("cuda:1#0", fleet) == 1.0  # the only slot named on cuda:1
    assert memory_share("cuda:0#5", fleet) == pytest.approx(1 / 4)  # a fourth slot joins


def test_a_gpu_cannot_be_whole_and_split_at_once() -> None:
    assert gpu_clash("cuda:0", ["cuda:1", "cuda:0#1"]) == "cuda:0#1"
    assert gpu_clash("cuda:0#1", ["cuda:0"]) == "cuda:0"
    assert gpu_clash("cuda:0#1", ["cuda:0#1"]) == "cuda:0#1"
    assert gpu_clash("cpu:1", ["cpu:1"]) == "cpu:1"
    assert gpu_clash("cuda:0#0", ["cuda:0#1", "cuda:1", "node2/cuda:0", "cpu:0"]) is None


def test_a_slot_sizes_its_kv_pool_by_its_share_and_by_what_is_free() -> None:
    gib = 1 << 30
    whole = kv_budget(free=100 * gib, gpu_total=140 * gib)
    assert whole == int(100 * gib * GPU_KV_FRACTION)
    first = kv_budget(free=138 * gib, gpu_total=140 * gib, share=0.5)  # before its peer allocated
    second = kv_budget(free=138 * gib - first - 2 * gib, gpu_total=140 * gib, share=0.5)  # after
    assert first == second == int(70 * gib * GPU_KV_FRACTION)
    assert first + second < 140 * gib
    assert kv_budget(free=30 * gib, gpu_total=140 * gib, share=0.5) == int(30 * gib * GPU_KV_FRACTION)
    assert kv_budget(free=100 * gib, gpu_total=140 * gib, share=0.5, cap=gib) == gib  # --kv-memory caps it
    assert kv_budget(free=64 * gib, gpu_total=None) == DEFAULT_CPU_KV_BYTES  # a CPU: a quarter, capped
