"""The fleet's vocabulary: the words the engine, the store and the console share for a worker's role and
state, a step's phase, a device's kind, what happened to a worker or a request, and how a device's peaks
were found. Torch-free and importing nothing of fleetctl, so every layer may use it."""

from enum import StrEnum


class WorkerRole(StrEnum):
    PREFILL = "prefill"
    DECODE = "decode"
    MIXED = "mixed"  # both phases, no handoff: the colocated baseline, or beside prefill and decode workers

    def covers(self, phase: "WorkerRole") -> bool:
        """Whether this role's workers do `phase`'s work (PREFILL: take prompts; DECODE: decode): a mixed
        worker does both."""
        return self is phase or self is WorkerRole.MIXED


PHASES = (WorkerRole.PREFILL, WorkerRole.DECODE)  # the work a fleet needs workers for: prompts, and decoding


class Quantization(StrEnum):
    """The format of a worker's linear weights (`--quantization`); auto is int4 for a model whose kept GGUF
    holds 4-bit blocks, none otherwise."""

    AUTO = "auto"
    NONE = "none"
    INT8 = "int8"
    INT4 = "int4"


class Phase(StrEnum):
    """What a model step (and the time spent in it) serves."""

    PREFILL = "prefill"
    DECODE = "decode"


class WorkerState(StrEnum):
    STARTING = "starting"
    RUNNING = "running"
    DRAINING = "draining"
    CHECKPOINTED = "checkpointed"
    STOPPED = "stopped"
    FAILED = "failed"


class EventKind(StrEnum):
    START = "start"
    STOP = "stop"
    DRAIN = "drain"  # a drain finished: the worker holds no session and takes no new work
    RESUME = "resume"  # a drained (or draining) worker takes work again
    CHECKPOINT = "checkpoint"
    RESTORE = "restore"
    MIGRATE = "migrate"
    MOVE = "move"  # a session moved live between two workers (or a move called off): stages, bytes, downtime
    FAILURE = "failure"
    RESTART = "restart"  # the supervisor restarted a worker that died
    GAVE_UP = "gave-up"  # a worker failed too often: the supervisor does not restart it again
    BUSY = "busy"  # requests refused with 429 (the queue was full); at most one event per BUSY_EVENT_S
    PLAN = "plan"  # an autoplan decision (apply, wait, hold or skip) and its reason
    REBALANCE = "rebalance"  # a rebalance ended (done or failed): the moves it made
    SWITCH = "switch"  # a worker changed role in place (the same process, a new id; `was` names the old one)
    STALL = "stall"  # a worker holding work stopped stepping (fleet/stalls.py), or its stall ended


class RequestOutcome(StrEnum):
    OK = "ok"
    ERROR = "error"
    CANCELLED = "cancelled"


class DeviceKind(StrEnum):
    CPU = "cpu"
    CUDA = "cuda"


class PeakSource(StrEnum):
    CALIBRATED = "calibrated"
    SPEC_TABLE = "spec-table"
