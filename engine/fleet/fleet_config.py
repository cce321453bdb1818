"""A fleet's shape: which workers, with which roles, on which devices (and CPU cores), all sharing one
set of engine settings."""

import dataclasses
import os
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated

from fleetctl.domain import DeviceKind, Quantization, WorkerRole
from fleetctl.engine.api.bodies import DEFAULT_HOLD_S
from fleetctl.engine.api.device_names import DeviceError, gpu_clash, gpu_slots, memory_share
from fleetctl.engine.core.auto_dtype import auto_dtype
from fleetctl.engine.core.engine_settings import MODEL_OPTION, DType, EngineSettings
from fleetctl.engine.core.local_devices import check_device, gpu_count
from fleetctl.engine.paths import store_file
from fleetctl.engine.planner.autoplan_settings import AutoplanSettings
from fleetctl.engine.worker.shm_files import SHM_DIR
from fleetctl.engine.worker.spec import WorkerSpec
from fleetctl.errors import UserError
from fleetctl.options import COMMA_LIST, EMPTY_IS_NONE, CliOption, Combined, Conversion, Derived, Nested

# Conditional disaggregation's default, measured on real fleets (`scripts/bench_agent_cache.py --local-sweep`:
# agent sessions, smollm2-135m, 1 prefill + 1 decode CPU slot, the cache on, one fleet per threshold): later
# turns' TTFT p50 0.92 s at 0 (never local), 0.78 s at 64, 0.61 s at 128 (every later turn local), 0.61 s at
# 256, 0.58 s at 1024 (within noise); throughput unchanged. A turn its decode worker prefills skips the handoff
# and hits the answers that worker wrote, which the prefill pool never saw. The trace had no longer uncached
# parts: 128 is the smallest threshold that took the whole gain.
DEFAULT_LOCAL_PREFILL_TOKENS = 128


class FleetConfigError(UserError):
    """A fleet layout that cannot be built (bad counts, devices, or a device used twice)."""


def _one_worker_each(devices: tuple[str, ...]) -> None:
    for i, device in enumerate(devices):
        if (clash := gpu_clash(device, devices[i + 1:])) is not None:
            if clash == device:
                raise FleetConfigError(f"{device} is named twice: a CPU slot hosts one worker (name a GPU "
                                       "twice, or cuda:N#0,cuda:N#1, to split it between workers)")
            raise FleetConfigError(f"{device} and {clash} are the same GPU named whole and as a slot: name it "
                                   "one way")


@dataclass(frozen=True)
class Supervision:
    """How the fleet survives its workers' failures (docs/architecture.md, "Failure")."""

    restart: Annotated[bool, CliOption(  # not one stopped or checkpointed on purpose
        "--restart/--no-restart", help="Restart workers that die (with backoff).")] = True
    backoff_s: float = 1.0  # before the first restart; doubled for each further crash in the window
    backoff_max_s: float = 60.0
    max_crashes: int = 5  # crashes within crash_window_s after which a worker is not restarted again
    crash_window_s: float = 600.0
    # how often a worker says it is alive: from a command line, a quarter of the timeout, at most 1 s
    heartbeat_s: Annotated[float, Derived("heartbeat_timeout_s", compute=lambda timeout: min(1.0, timeout / 4))] = 1.0
    heartbeat_timeout_s: Annotated[float, CliOption(
        "--heartbeat-timeout", min=0.1, help="Seconds of silence after which a worker counts as hung and is killed "
                                             "(its sessions recomputed, the worker restarted).")] = 10.0
    step_timeout_s: Annotated[float, CliOption(  # its heartbeat stops
        "--step-timeout", min=0.1, help="Seconds: one model step running longer counts as hung.")] = 120.0
    max_retries: int = 2  # a request that failed on more workers than this is failed as poisoned
    checkpoint_timeout_s: Annotated[float, CliOption(
        "--checkpoint-timeout", min=0.1,
        help="Seconds: a checkpoint not written by then is called off; the worker serves on.")] = 300.0
    hold_s: float = DEFAULT_HOLD_S  # a checkpoint's sessions wait this long for a restore (unless it says)

    def __post_init__(self) -> None:
        for name in ("backoff_s", "backoff_max_s", "crash_window_s", "heartbeat_s", "heartbeat_timeout_s",
                     "step_timeout_s", "checkpoint_timeout_s"):
            if getattr(self, name) <= 0:
                raise FleetConfigError(f"{name} must be > 0")
        if self.hold_s < 0:
            raise FleetConfigError("hold_s must be >= 0")
        if self.max_crashes < 1 or self.max_retries < 0:
            raise FleetConfigError("max_crashes must be >= 1 and max_retries >= 0")
        if self.heartbeat_timeout_s <= self.heartbeat_s:
            raise FleetConfigError("the heartbeat timeout must be longer than the heartbeat interval")


RoleFormats = tuple[tuple[WorkerRole, Quantization], ...]


def role_formats(prefill: Quantization | None, decode: Quantization | None) -> RoleFormats:
    """`--prefill-quantization` and `--decode-quantization` as `FleetConfig.role_quantization`."""
    return tuple((role, value) for role, value in ((WorkerRole.PREFILL, prefill), (WorkerRole.DECODE, decode))
                 if value is not None)


@dataclass(frozen=True)
class FleetConfig:
    model_dir: Annotated[Path, MODEL_OPTION]
    prefill: Annotated[int, CliOption("--prefill", help="Prefill workers.")] = 1
    decode: Annotated[int, CliOption("--decode", help="Decode workers.")] = 1
    colocated: Annotated[int, CliOption(  # > 0: prefill/decode ignored
        "--colocated", help="Baseline: N mixed workers, no handoff.")] = 0
    # one per worker, the first ones taken, and any beyond them free for `start`, `rebalance` and `--autoplan
    # --max-workers` (an elastic pool); () picks cuda:0.. or cpu:0..; a GPU named twice is split into slots
    # (`cuda:0,cuda:0` becomes `cuda:0#0,cuda:0#1`), each worker sizing its KV pool by its share
    devices: Annotated[tuple[str, ...], CliOption(
        "--devices", convert=COMMA_LIST,
        help="cuda:0,cuda:1,… or cpu:0,cpu:1,… one per worker, and any beyond them free for start, rebalance and "
             "--max-workers; a GPU named twice (cuda:0,cuda:0) is split into slots cuda:0#0, cuda:0#1, each with an "
             "even share of its memory (or --kv-memory).")] = ()
    engine: Annotated[EngineSettings, Nested(panel="Engine")] = field(default_factory=EngineSettings)
    # a role's own weight format over engine.quantization (bf16 prefill beside int4 decode); every worker of a role
    # has its role's, a worker that changes role takes its new one's
    role_quantization: Annotated[RoleFormats, Combined(
        CliOption("--prefill-quantization", type=Quantization | None, default=None, panel="Engine",
                  help="The prefill workers' linear weights (default --quantization): prefill is arithmetic-bound, "
                       "so 16-bit weights beside 4-bit decode."),
        CliOption("--decode-quantization", type=Quantization | None, default=None, panel="Engine",
                  help="The decode workers' linear weights (default --quantization)."),
        build=role_formats)] = ()
    # conditional disaggregation (0: never; see DEFAULT_LOCAL_PREFILL_TOKENS)
    local_prefill_tokens: Annotated[int, CliOption(
        "--local-prefill-tokens", min=0,
        help="A decode worker caching part of a prompt prefills it itself (no handoff) when at most this many of its "
             "tokens are uncached there; 0: always the prefill pool.")] = DEFAULT_LOCAL_PREFILL_TOKENS
    max_queue: Annotated[int, CliOption(  # beyond it a request is "busy"
        "--max-queue", min=0, help="Requests waiting to generate (queued, prefilling, KV awaiting a decode worker) "
                                   "beyond this get HTTP 429 with Retry-After.")] = 256
    kept_requests: Annotated[int, CliOption(  # the controller's memory of finished requests is bounded by it
        "--kept-requests", min=1, help="Finished requests kept in memory, newest first, for /fleet/requests and "
                                       "the console's requests view (the store keeps every one).")] = 10_000
    ready_timeout_s: float = 300.0
    # the SQLite metrics store (None: keep metrics in memory only; a command line always names one)
    store_path: Annotated[Path | None, CliOption(
        "--store", convert=Conversion(str, store_file, str), default="",
        help="SQLite metrics store (default $FLEET_HOME/fleet.db).")] = None
    served_model_name: Annotated[str | None, CliOption(  # default: the model directory's name
        "--served-model-name", convert=EMPTY_IS_NONE,
        help="The model name clients use (default: the model's store name).")] = None
    otlp_endpoint: Annotated[str | None, CliOption(  # one trace per request (fleet/tracing.py)
        "--otlp-endpoint", convert=EMPTY_IS_NONE,
        help="An OTLP/HTTP traces URL (a collector's http://host:4318/v1/traces): each request's trace — "
             "admission, queue, prefill, KV handoff, decode, live moves.")] = None
    # with a store, replay the last 5 minutes this often for the current layout's share of the best one's goodput
    # (fleet/ops/split_regret.py); 0: never
    split_regret_interval_s: float = 30.0
    supervision: Annotated[Supervision, Nested(panel="Supervision")] = field(default_factory=Supervision)
    shm_dir: Path = SHM_DIR  # where workers publish KV handoff buffers (CPU)
    autoplan: Annotated[AutoplanSettings | None, Nested(  # plan and rebalance by itself (`fleet/autoplan.py`)
        panel="Autoplan",
        gate=CliOption("--autoplan", help="Plan every interval and rebalance when the gain holds."))] = None

    def __post_init__(self) -> None:
        if self.colocated < 0 or self.prefill < 0 or self.decode < 0:
            raise FleetConfigError("worker counts must be >= 0")
        if not self.colocated and (self.prefill < 1 or self.decode < 1):
            raise FleetConfigError("a disaggregated fleet needs --prefill >= 1 and --decode >= 1 (or --colocated N)")
        if self.devices and len(self.devices) < self.num_workers:
            raise FleetConfigError(f"{len(self.devices)} devices given for {self.num_workers} workers: give one each "
                                   f"(devices beyond them are free for the fleet to grow onto)")
        try:
            for device in self.devices:
                check_device(device, indexed=True)
            object.__setattr__(self, "devices", gpu_slots(self.devices))  # frozen: normalised once, here
        except DeviceError as exc:
            raise FleetConfigError(str(exc)) from None
        _one_worker_each(self.devices)
        if self.local_prefill_tokens < 0:
            raise FleetConfigError("--local-prefill-tokens must be >= 0")
        if stray := [role.value for role, _ in self.role_quantization if role not in self.roles]:
            raise FleetConfigError(f"a weight format for {', '.join(stray)} workers, which this fleet has none of "
                                   f"(its roles: {', '.join(r.value for r in self.roles)})")
        if self.autoplan and self.store_path is None:
            raise FleetConfigError("--autoplan needs a metrics store (it plans from it)")
        limit = self.autoplan.max_workers if self.autoplan else None
        if limit is not None and not self.num_workers <= limit <= len(self.pool):
            raise FleetConfigError(f"--max-workers {limit} must be between the fleet's {self.num_workers} workers "
                                   f"and the {len(self.pool)} devices of --devices ({', '.join(self.pool)})")

    @property
    def num_workers(self) -> int:
        return self.colocated or self.prefill + self.decode

    @property
    def pool(self) -> tuple[str, ...]:
        """Every device the fleet may run workers on: its workers' first, then the free ones."""
        return self.devices or default_devices(self.num_workers)

    @property
    def roles(self) -> tuple[WorkerRole, ...]:
        return (WorkerRole.MIXED,) if self.colocated else (WorkerRole.PREFILL, WorkerRole.DECODE)

    def quantization_for(self, role: WorkerRole) -> Quantization:
        """The weight format `role`'s workers load: the role's own, else the fleet's."""
        return dict(self.role_quantization).get(role, self.engine.quantization)

    def worker_roles(self) -> list[tuple[str, WorkerRole]]:
        if self.colocated:
            return [(f"mixed-{i}", WorkerRole.MIXED) for i in range(self.colocated)]
        return [(f"prefill-{i}", WorkerRole.PREFILL) for i in range(self.prefill)] + [
            (f"decode-{i}", WorkerRole.DECODE) for i in range(self.decode)
        ]


def default_devices(count: int) -> tuple[str, ...]:
    """A GPU per worker; with more workers than GPUs they are dealt round the GPUs as slots (a one-GPU machine
    runs a prefill and a decode worker on cuda:0#0 and cuda:0#1); with no GPU, a CPU slot each."""
    gpus = gpu_count()
    if gpus:
        return gpu_slots(f"cuda:{i % gpus}" for i in range(count))
    return tuple(f"cpu:{i}" for i in range(count))


def cpu_slot_cores(slot: int, num_slots: int, cores: list[int]) -> tuple[int, ...]:
    """The cores a logical cpu:N slot is pinned to: an equal share, or one shared core when there are
    more slots than cores."""
    per_slot = len(cores) // num_slots
    if per_slot == 0:
        return (cores[slot % len(cores)],)
    return tuple(cores[slot * per_slot : (slot + 1) * per_slot])


def pinned_cores(device: str, fleet_devices: Iterable[str]) -> tuple[int, ...]:
    """The cores `device` is pinned to among the fleet's devices (() leaves a worker unpinned). The CPU slots of a
    node share its cores evenly. Where a node mixes CPU slots with GPU workers, each GPU worker keeps one core of
    its own and the slots share the rest: a GPU worker's kernel launches would otherwise wait behind the slots'
    matmuls. GPU workers with no CPU slot beside them are left unpinned. Slots on different nodes of a Ray cluster
    do not share cores: only `device`'s node counts."""
    name = check_device(device, indexed=True)
    here = [peer for peer in {check_device(d, indexed=True) for d in fleet_devices} | {name} if peer.node == name.node]
    cpu_slots = sorted(peer.index for peer in here if peer.kind is DeviceKind.CPU)
    gpu_workers = sorted(peer.local for peer in here if peer.kind is not DeviceKind.CPU)
    cores = sorted(os.sched_getaffinity(0))
    reserved = len(gpu_workers) if cpu_slots and len(cores) > len(gpu_workers) else 0
    shared = cores[:len(cores) - reserved]
    if name.kind is not DeviceKind.CPU:
        return (cores[len(shared) + gpu_workers.index(name.local)],) if reserved else ()
    return cpu_slot_cores(cpu_slots.index(name.index), len(cpu_slots), shared)


def worker_specs(config: FleetConfig) -> list[WorkerSpec]:
    devices = config.pool[:config.num_workers]
    names = [check_device(d, indexed=True) for d in config.pool]  # a worker started later shares the dtype
    engine = config.engine
    if engine.dtype is DType.AUTO:  # once for the fleet: a worker cannot adopt KV computed in another dtype
        engine = dataclasses.replace(engine, dtype=auto_dtype(names))
    return [
        WorkerSpec(worker_id=worker_id, role=role, device=device, model_dir=config.model_dir,
                   engine=dataclasses.replace(engine, quantization=config.quantization_for(role)),
                   cores=pinned_cores(device, devices), store_path=config.store_path,
                   heartbeat_s=config.supervision.heartbeat_s, step_timeout_s=config.supervision.step_timeout_s,
                   shm_dir=config.shm_dir, memory_share=memory_share(device, devices))
        for (worker_id, role), device in zip(config.worker_roles(), devices, strict=True)
    ]
