"""The devices a plan lays its splits over: the fleet's own, a list of this machine's devices
(`cpu:0,cpu:1,cpu:2`), or a what-if fleet of N GPUs from the spec table (`8xH100`), whose times are
the measured ones scaled by the ratio of published peaks."""

import re
from dataclasses import dataclass

from fleetctl.domain import DeviceKind
from fleetctl.engine.api.device_names import DeviceError, parse_device_name
from fleetctl.engine.metrics.gpu_specs import GPU_SPECS, GpuSpec, find_gpu_spec
from fleetctl.engine.planner.costs import DeviceCosts
from fleetctl.errors import UserError

MAX_DEVICES = 64
_WHAT_IF = re.compile(r"\s*(\d+)\s*[x×]\s*(\S.*?)\s*", re.IGNORECASE)


@dataclass(frozen=True)
class PlanDevices:
    names: tuple[str, ...]  # "cpu:0", … or the GPU's name once per device of a what-if fleet
    kind: DeviceKind  # CUDA for a what-if fleet
    gpu: GpuSpec | None = None  # set for a what-if fleet

    def __post_init__(self) -> None:
        if not 1 <= len(self.names) <= MAX_DEVICES:
            raise UserError(f"a plan takes 1 to {MAX_DEVICES} devices, not {len(self.names)}")

    @property
    def label(self) -> str:
        return f"{len(self.names)}x {self.gpu.name}" if self.gpu else ",".join(self.names)

    def as_json(self) -> dict[str, object] | None:
        """The what-if fleet (None for real devices)."""
        return {"gpu": self.gpu.name, "count": len(self.names)} if self.gpu else None

    def costs_from(self, measured: DeviceCosts) -> tuple[DeviceCosts, str | None]:
        """The cost model for these devices from the one fitted on `measured.kind`, and for a what-if fleet
        the sentence that states how it was scaled."""
        if self.gpu is None:
            return measured, None
        if measured.peaks is None:
            raise UserError("the window has no MFU/MBU samples to scale the measured devices from")
        compute = measured.peaks.peak_flops / self.gpu.tensor_flops
        bandwidth = measured.peaks.peak_bytes_per_s / self.gpu.bytes_per_s
        note = (f"what-if {self.label}: the {measured.kind.value} cost model fitted here, prefill times scaled by "
                f"peak FLOP/s ({measured.peaks.peak_flops / 1e12:.3g} -> {self.gpu.tensor_flops / 1e12:.4g} TFLOP/s "
                f"bf16) and decode and handoff times by memory bandwidth ({measured.peaks.peak_bytes_per_s / 1e9:.3g} "
                f"-> {self.gpu.bytes_per_s / 1e9:.4g} GB/s): it assumes the GPUs reach the same fraction of their "
                f"peaks as the measured devices did, fixed per-step overheads included")
        return measured.scaled(compute, bandwidth), note


def parse_devices(text: str) -> PlanDevices:
    """`8xH100` (a what-if fleet) or `cpu:0,cpu:1,…` (devices of one kind)."""
    what_if = _WHAT_IF.fullmatch(text)
    if what_if:
        gpu = find_gpu_spec(what_if.group(2))
        if gpu is None:
            known = ", ".join(spec.name for spec in GPU_SPECS)
            raise UserError(f"unknown GPU {what_if.group(2)!r} in --devices {text!r}: the spec table knows "
                            f"{known}")
        return PlanDevices((gpu.name,) * int(what_if.group(1)), DeviceKind.CUDA, gpu)
    names = [name.strip() for name in text.split(",") if name.strip()]
    try:
        parsed = [parse_device_name(name, indexed=True) for name in names]
    except DeviceError as exc:
        raise UserError(f"{exc} (or NxGPU for a what-if fleet, e.g. 8xH100)") from None
    if not parsed:
        raise UserError(f"bad --devices {text!r}: use cpu:0,cpu:1,… or NxGPU, e.g. 8xH100")
    if len(set(parsed)) != len(parsed):
        raise UserError(f"--devices {text!r} names a device twice")
    if len({d.kind for d in parsed}) > 1:
        raise UserError(f"--devices {text!r} mixes CPU slots and GPUs: plan one kind of device at a time")
    return PlanDevices(tuple(str(d) for d in sorted(parsed, key=lambda d: d.index)), parsed[0].kind)
