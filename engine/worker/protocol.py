"""Typed messages between the fleet controller and its worker processes (pickled over a pipe).
Plain data only: token ids, parameters, KV handles, statistics; never tensors (and no torch import:
the controller reads these)."""

from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path

from fleetctl.domain import Phase, WorkerRole
from fleetctl.engine.checkpoint.format import RestoreMode
from fleetctl.engine.core.kv_tiers.file_tier import TierStats
from fleetctl.engine.core.output import TokenLogprobs
from fleetctl.engine.core.sequence import FinishReason, SamplingParams
from fleetctl.engine.worker.prefix_summary import PrefixChanges


class HandleKind(StrEnum):
    SHM = "shm"  # a file in /dev/shm: outlives its producer
    CUDA_IPC = "cuda-ipc"  # device memory shared through CUDA IPC: dies with its producer


@dataclass(frozen=True)
class KVHandle:
    """Where a worker published a sequence's KV [layers, 2, n_blocks, block_size, Hkv, d]."""

    handle_id: str
    kind: HandleKind
    shape: tuple[int, ...]
    dtype: str
    nbytes: int
    location: str  # shm: file path; cuda-ipc: its lease's path (the payload carries the buffer)
    payload: bytes = b""  # cuda-ipc: pickled torch IPC rebuild recipe
    node: str = ""  # Ray fleets: the producer's node id (a consumer elsewhere pulls through Ray); "": local
    owner: str = ""  # Ray fleets: the producer's actor name, which serves pulls of its buffers
    # a handoff's KV starts at this block of the sequence: those before were dropped (engine/core/kv_window.py)
    first_block: int = 0

    @property
    def outlives_producer(self) -> bool:
        return self.kind is HandleKind.SHM

    def unlink(self) -> None:
        """Free a shared-memory buffer, or end a CUDA IPC lease (fetches raise from then on); safe twice
        and from any process. Device memory is the producer's to free."""
        if self.location:
            Path(self.location).unlink(missing_ok=True)


class CheckpointAfter(StrEnum):
    """What a worker does once its checkpoint is written."""

    RESUME = "resume"  # keep serving
    HOLD = "hold"  # stay paused (a migration): Resume or Shutdown follows
    STAND_DOWN = "stand-down"  # exit

# controller -> worker


@dataclass(frozen=True)
class RunRequest:
    """Prefill (and, on decode/mixed workers, decode) a request. With output ids it is a recompute."""

    request_id: str
    prompt_token_ids: list[int]
    params: SamplingParams
    seed: int
    output_token_ids: list[int] = field(default_factory=list)
    session: str = ""  # the agent session it is a turn of: its blocks stay retained (`--session-ttl`) once it ends


@dataclass(frozen=True)
class Adopt:
    """Decode worker: take a sequence prefilled elsewhere, its KV behind `handle`."""

    request_id: str
    prompt_token_ids: list[int]
    output_token_ids: list[int]
    params: SamplingParams
    seed: int
    handle: KVHandle
    session: str = ""  # as RunRequest's


@dataclass(frozen=True)
class ReleaseKV:
    """Prefill worker: the handoff is acknowledged (or abandoned); free the blocks and the buffer."""

    request_id: str


@dataclass(frozen=True)
class Abort:
    request_id: str


@dataclass(frozen=True)
class Shutdown:
    pass


@dataclass(frozen=True)
class TakeCheckpoint:
    """Pause after the current step, save the complete state under root/name, then do `after`."""

    root: str
    name: str
    after: CheckpointAfter


@dataclass(frozen=True)
class Resume:
    pass


@dataclass(frozen=True)
class Restore:
    """A standby worker (started for a restore or a migration, model loaded, no sessions): verify the
    checkpoint and load its sessions. Answered by Restored or RestoreFailed."""

    path: str


@dataclass(frozen=True)
class Rename:
    """A migration's destination takes over the id of the worker it replaces."""

    worker_id: str


@dataclass(frozen=True)
class SwitchRole:
    """Re-lay the worker for `role` in place and take the id `worker_id` (`fleet/ops/switch.py`): weights, KV pool
    and prefix cache stay. Sent once it holds no session; answered RoleSwitched, or SwitchFailed (nothing
    changed)."""

    role: WorkerRole
    worker_id: str


# worker -> controller


@dataclass(frozen=True)
class WorkerLoading:
    """The process is up (torch imported) and is loading the model; WorkerReady follows."""

    worker_id: str
    pid: int


@dataclass(frozen=True)
class WorkerReady:
    worker_id: str
    pid: int
    num_kv_blocks: int
    block_size: int
    load_seconds: float
    device_name: str
    peak_flops: float  # the device's peaks at the worker's dtype (spec table or calibration)
    peak_bytes_per_s: float
    weights: str = ""  # its layers' weights: the dtype, or the quantized format (bfloat16, int8, int4-gguf)
    kv_dtype: str = ""  # its KV pool's stored format: the dtype, or int8


@dataclass(frozen=True)
class WorkerFailed:
    """The worker's last words: why it is exiting (a model it cannot load, a device it cannot use, a bug)."""

    worker_id: str
    reason: str


@dataclass(frozen=True)
class Handoff:
    """A prefill worker parked a sequence: its KV is published for a decode worker to adopt."""

    handle: KVHandle
    publish_seconds: float  # exporting and publishing the KV


@dataclass(frozen=True)
class TokenEvent:
    request_id: str
    token_id: int
    finished: bool
    finish_reason: FinishReason | None
    logprobs: TokenLogprobs | None = None  # only for a request that asked for them
    # a prefill worker's first token of a sequence it parked: the prefill's end, with where its KV waits (None
    # there when publishing raised: RequestFailed follows)
    handoff: Handoff | None = None


@dataclass(frozen=True)
class StepReport:
    """One engine step: its tokens and what the worker looks like after it."""

    worker_id: str
    phase: Phase
    tokens: list[TokenEvent]
    seq_tokens: list[int]  # per token event: tokens its sequence ran (computed) in this step
    num_seqs: int
    num_tokens: int
    context_tokens: int
    seconds: float
    flops: int  # model FLOPs of the step (cost model)
    bytes: int  # bytes moved by the step: weights + KV read and written
    free_blocks: int
    running: int
    waiting: int
    ended_at: float  # time.time()
    chunks: dict[str, int] = field(default_factory=dict)  # prompts computed part-way: tokens run this step
    # prefill steps: prompt tokens a sequence's admission took from the prefix cache, by request id (none: absent)
    cached_tokens: dict[str, int] = field(default_factory=dict)
    tier_tokens: dict[str, dict[str, int]] = field(default_factory=dict)  # of those, what a KV tier served, by tier
    tier_io: dict[str, TierStats] = field(default_factory=dict)  # the process's KV tier counts so far, by tier
    prefix: PrefixChanges | None = None  # what the router should know of its prefix cache, when it changed
    mask_seconds: dict[str, float] = field(default_factory=dict)  # grammar masks' compute time, by request id
    drafted: int = 0  # draft tokens the step verified (speculative decoding), over its sequences
    accepted: int = 0  # of those, the ones that stood
    verifications: int = 0  # sequences that verified a draft in the step


@dataclass(frozen=True)
class Republished:
    """A restored prefill worker published a parked sequence's KV again (its first token, and the handoff it
    came with, were the checkpointed process's)."""

    request_id: str
    handoff: Handoff


@dataclass(frozen=True)
class Adopted:
    request_id: str
    nbytes: int
    seconds: float
    free_blocks: int
    cross_node: bool = False  # pulled from another node of a Ray cluster (its object store), not shared memory


@dataclass(frozen=True)
class AdoptFailed:
    request_id: str
    reason: str
    retryable: bool  # False when the KV itself is gone: recompute instead


@dataclass(frozen=True)
class RequestFailed:
    """The worker dropped a request. `retry`: serving it raised (the worker serves its other sequences
    on); the controller may try it on another worker. Otherwise the request itself is invalid."""

    request_id: str
    message: str
    retry: bool = False


@dataclass(frozen=True)
class Heartbeat:
    """Sent every few seconds, also during a long step, while the worker is not hung (worker/heartbeat.py)."""

    worker_id: str


@dataclass(frozen=True)
class CheckpointStarted:
    writer_pid: int  # the forked writer process (killing it must leave nothing listed)
    paused_at: float  # time.time() when the worker stopped stepping


@dataclass(frozen=True)
class CheckpointDone:
    path: str
    sessions: int
    nbytes: int
    seconds: float
    paused_at: float


@dataclass(frozen=True)
class CheckpointFailed:
    reason: str


@dataclass(frozen=True)
class RoleSwitched:
    worker_id: str  # its new id
    role: WorkerRole
    seconds: float  # the engine's re-layout, the new role's kernel warm-up included


@dataclass(frozen=True)
class SwitchFailed:
    reason: str


@dataclass(frozen=True)
class Restored:
    mode: RestoreMode
    reason: str | None
    sessions: int
    nbytes: int
    seconds: float
    request_ids: list[str]


@dataclass(frozen=True)
class RestoreFailed:
    """The checkpoint was refused (corrupt, wrong role, unreadable); nothing was loaded."""

    reason: str


@dataclass(frozen=True)
class Capacity:
    """Sent after blocks are freed outside a step (release, abort), so the router sees the room."""

    worker_id: str
    free_blocks: int
