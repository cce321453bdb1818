"""What a worker process is started with: its id, role, device and cores, and the fleet-wide engine
settings it shares with every other worker."""

from dataclasses import dataclass, field
from pathlib import Path

from fleetctl.domain import DeviceKind, WorkerRole
from fleetctl.engine.api.device_names import parse_device_name
from fleetctl.engine.core.engine_settings import EngineConfig, EngineSettings
from fleetctl.engine.worker.shm_files import SHM_DIR


@dataclass(frozen=True)
class WorkerSpec:
    worker_id: str
    role: WorkerRole
    device: str  # "cpu:N", "cuda:N" or a GPU's slot "cuda:N#S", or on a named Ray node "node2/cuda:N"
    model_dir: Path
    engine: EngineSettings = field(default_factory=EngineSettings)
    cores: tuple[int, ...] = ()  # CPU cores to pin to (cpu:N slots); () leaves affinity alone
    store_path: Path | None = None  # the fleet's metrics store: caches this device's measured peaks
    heartbeat_s: float = 1.0  # how often the worker says it is alive
    step_timeout_s: float = 120.0  # a step running longer is hung: the heartbeat falls silent
    shm_dir: Path = SHM_DIR  # where KV handoff buffers are published (CPU)
    fleet_pid: int | None = None  # the controller's pid, naming the handoff buffers (None: the parent process's)
    memory_share: float = 1.0  # of its GPU, when it is one of several workers there (`device_names.memory_share`)
    log_path: Path | None = None  # where its process writes its stdout and stderr (the controller reads it)

    def engine_config(self) -> EngineConfig:
        device = parse_device_name(self.device)
        on_cpu = device.kind is DeviceKind.CPU
        return EngineConfig(model_dir=self.model_dir, device="cpu" if on_cpu else device.physical,
                            settings=self.engine, detokenize=False, prefill_only=self.role is WorkerRole.PREFILL,
                            memory_share=self.memory_share)
