"""Device peaks (spec table, calibration cached in the store) and the pynvml GPU sampler."""

import io
from types import SimpleNamespace

import pynvml
import pytest
import torch

from fleetctl.domain import DeviceKind, PeakSource
from fleetctl.engine.metrics import device_peaks as peaks_module
from fleetctl.engine.metrics.calibration import MAX_WORKING_SET, MIN_WORKING_SET, working_set
from fleetctl.engine.metrics.device_peaks import device_identity, device_peaks, spec_peaks
from fleetctl.engine.metrics.gpu_sampler import GpuSampler
from fleetctl.store.db import open_db

CPU = torch.device("cpu")
WEIGHTS = 4 << 20  # a small model: calibrated on the smallest working set


@pytest.mark.parametrize(
    ("name", "flops", "bandwidth"),
    [
        ("NVIDIA H200", 989.5e12, 4.8e12),
        ("NVIDIA H100 80GB HBM3", 989.5e12, 3.35e12),
        ("NVIDIA H100 PCIe", 756.5e12, 2.0e12),
        ("NVIDIA A100-SXM4-80GB", 312e12, 2.039e12),
        ("NVIDIA A100 80GB PCIe", 312e12, 1.935e12),
        ("NVIDIA A100-PCIE-40GB", 312e12, 1.555e12),
        ("NVIDIA A10", 125e12, 0.6e12),
        ("NVIDIA L40S", 362.05e12, 0.864e12),
        ("NVIDIA L40", 181.05e12, 0.864e12),
        ("NVIDIA L4", 121e12, 0.3e12),
        ("NVIDIA GeForce RTX 4090", 165.2e12, 1.008e12),
    ],
)
def test_spec_table_matches_the_most_specific_name(name, flops, bandwidth):
    assert spec_peaks(name, torch.bfloat16) == pytest.approx((flops, bandwidth))


def test_spec_table_fp32_and_unknown_devices():
    assert spec_peaks("NVIDIA H200", torch.float32) == pytest.approx((67e12, 4.8e12))
    assert spec_peaks("NVIDIA A10G", torch.bfloat16) is None
    assert spec_peaks("NVIDIA GeForce RTX 3090 Ti", torch.bfloat16) is None
    assert spec_peaks("NVIDIA H200", torch.int8) is None


def test_cpu_identity_names_the_model_threads_and_working_set(monkeypatch):
    cpuinfo = "processor\t: 0\nvendor_id\t: GenuineIntel\nmodel name\t: Intel(R) Xeon(R) Platinum 8480+\n"
    monkeypatch.setattr(peaks_module, "open", lambda path: io.StringIO(cpuinfo), raising=False)
    assert peaks_module.cpu_model_name.__wrapped__() == "Intel(R) Xeon(R) Platinum 8480+"
    monkeypatch.setattr(peaks_module, "cpu_model_name", lambda: "Test CPU 9000")
    monkeypatch.setattr(torch, "get_num_threads", lambda: 6)
    assert device_identity(CPU, 64 << 20) == ("cpu:Test CPU 9000:6threads:64MiB", "Test CPU 9000")
    assert device_identity(CPU, (128 << 20) + 5) == ("cpu:Test CPU 9000:6threads:128MiB", "Test CPU 9000")


def test_working_set_follows_the_weights_within_bounds():
    assert working_set(1000) == MIN_WORKING_SET
    assert working_set(270_000_000) == 512 << 20
    assert working_set(100 << 20) == 128 << 20
    assert working_set(10 << 30) == MAX_WORKING_SET


def test_calibration_runs_once_per_device_and_dtype(tmp_path, monkeypatch):
    calls = []
    real = peaks_module.calibrate

    def counting(device, dtype, working_set_bytes, budget_s=1.0):
        calls.append(dtype)
        return real(device, dtype, working_set_bytes, budget_s=0.1)

    monkeypatch.setattr(peaks_module, "calibrate", counting)
    path = tmp_path / "fleet.db"
    first = device_peaks(CPU, torch.float32, WEIGHTS, path)
    assert first.how_measured is PeakSource.CALIBRATED and first.kind is DeviceKind.CPU
    assert first.peak_flops > 1e8 and first.peak_bytes_per_s > 1e8

    again = device_peaks(CPU, torch.float32, WEIGHTS, path)  # from the cache: no second calibration
    assert again == first
    assert calls == [torch.float32]
    device_peaks(CPU, torch.bfloat16, WEIGHTS, path)  # another dtype is another peak
    assert calls == [torch.float32, torch.bfloat16]
    assert open_db(path)["devices"].count == 2
    assert device_peaks(CPU, torch.float32, WEIGHTS).how_measured is PeakSource.CALIBRATED  # no store: every time
    assert len(calls) == 3
    fresh = device_peaks(CPU, torch.float32, WEIGHTS, path, recalibrate=True)
    assert len(calls) == 4 and fresh.measured_at > first.measured_at
    assert device_peaks(CPU, torch.float32, WEIGHTS, path) == fresh  # the new measurement replaced the old


def test_gpu_sampler_returns_nothing_without_a_driver():
    if torch.cuda.is_available():
        pytest.skip("needs a machine without CUDA (this one has an NVIDIA driver)")
    sampler = GpuSampler()
    assert sampler.device_count == 0
    assert sampler.sample() == []
    sampler.close()


def test_gpu_sampler_converts_nvml_readings(monkeypatch):
    """With NVML faked: two GPUs, one without power readings, one failing mid-run."""
    failing = {"handle-1": False}

    def utilization(handle):
        if handle == "handle-1" and failing["handle-1"]:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_GPU_IS_LOST)
        return SimpleNamespace(gpu=87, memory=42)

    def power(handle):
        if handle == "handle-1":
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return 312_500

    shutdowns = []
    monkeypatch.setattr(pynvml, "nvmlInit", lambda: None)
    monkeypatch.setattr(pynvml, "nvmlShutdown", lambda: shutdowns.append(1))
    monkeypatch.setattr(pynvml, "nvmlDeviceGetCount", lambda: 2)
    monkeypatch.setattr(pynvml, "nvmlDeviceGetHandleByIndex", lambda i: f"handle-{i}")
    monkeypatch.setattr(pynvml, "nvmlDeviceGetUtilizationRates", utilization)
    monkeypatch.setattr(pynvml, "nvmlDeviceGetMemoryInfo", lambda h: SimpleNamespace(used=7 << 30))
    monkeypatch.setattr(pynvml, "nvmlDeviceGetPowerUsage", power)

    sampler = GpuSampler()
    first, second = sampler.sample(now=5.0)
    assert (first.ts, first.device_index, first.sm_util, first.mem_util) == (5.0, 0, 0.87, 0.42)
    assert (first.mem_used_bytes, first.power_w) == (7 << 30, 312.5)
    assert (second.device_index, second.power_w) == (1, None)
    failing["handle-1"] = True
    assert [s.device_index for s in sampler.sample()] == [0]
    sampler.close()
    assert shutdowns == [1]


def test_recalibrating_skips_identities_without_a_working_set(tmp_path) -> None:
    """`devices --recalibrate` crashed on a cache row written before identities named their working set."""
    from fleetctl.store.records import DeviceRecord

    identity = f"cpu:{peaks_module.cpu_model_name()}:1threads"
    legacy = DeviceRecord(identity, "bfloat16", DeviceKind.CPU, "cpu", None, 1e11, 1e9, PeakSource.CALIBRATED, 0.0)
    assert peaks_module.recalibrate_cpu(legacy, tmp_path / "fleet.db") is None
