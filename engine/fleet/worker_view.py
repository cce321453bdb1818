"""The controller's record of one worker: what it is (id, role, device, node), its state, its KV blocks
(`worker_kv.WorkerKV`, their one writer) and load as last reported, the requests it holds, and what its prefix
cache holds. Every part of the controller reads it; the router decides from it, the message handlers update
it."""

import time
from dataclasses import dataclass, field

from fleetctl.domain import WorkerRole, WorkerState
from fleetctl.engine.fleet.worker_kv import WorkerKV
from fleetctl.engine.worker.prefix_summary import PrefixIndex


@dataclass
class WorkerView:
    """The controller's picture of one worker, from its reports."""

    worker_id: str
    role: WorkerRole
    device: str
    state: WorkerState = WorkerState.STARTING
    node: str = ""  # the Ray node its process runs on ("" on this machine)
    node_lost: bool = False  # its process ended because the Ray cluster lost that node
    pid: int | None = None
    kv: WorkerKV = field(default_factory=WorkerKV)  # its KV pool: free as reported, reserved by the controller
    running: int = 0
    waiting: int = 0
    requests: set[str] = field(default_factory=set)  # request ids this worker holds
    device_name: str = ""
    peak_flops: float = 0.0
    peak_bytes_per_s: float = 0.0
    weights: str = ""  # its layers' weight format as it reported when ready (bfloat16, int8, int4-gguf)
    kv_dtype: str = ""  # its KV pool's stored format as it reported when ready (bfloat16, int8)
    load_s: float = 0.0  # how long its process took to load the model (its engine's construction), as reported
    was: str | None = None  # its id before it switched role in place
    last_error: str = ""  # why the worker's last process exited, in its own words
    last_heard: float = 0.0  # time.monotonic() of its last message (the watchdog's clock)
    last_step_at: float = 0.0  # time.monotonic() of its last step report (or of its ready, before any)
    recent_step_s: float = 0.0  # how long its recent steps took (an exponential average of the reports)
    stalled_since: float | None = None  # a stalled worker's last step (last_step_at then; fleet/stalls.py); None: not
    prefix: PrefixIndex = field(default_factory=PrefixIndex)  # what its prefix cache holds, as last reported
    prefilling: dict[str, int] = field(default_factory=dict)  # request id -> tokens routed here to prefill

    def began_stepping(self) -> None:
        """A new process answered ready: its stall clock starts now, with no step time learned yet."""
        self.last_step_at, self.recent_step_s = time.monotonic(), 0.0

    def stepped(self, seconds: float) -> None:
        """A step report came: `seconds` is how long the step ran."""
        self.last_step_at = time.monotonic()
        self.recent_step_s = seconds if not self.recent_step_s else 0.8 * self.recent_step_s + 0.2 * seconds

    def stalled_s(self) -> float | None:
        """How long it has gone without a step since it was found stalled (fleet/stalls.py); None: it is not."""
        return None if self.stalled_since is None else round(time.monotonic() - self.stalled_since, 1)

    def prefill_backlog(self) -> int:
        """Tokens routed here to prefill that it still holds: the work ahead of a new prompt. Entries of
        requests it no longer holds are dropped here, whatever path they left by."""
        for rid in [rid for rid in self.prefilling if rid not in self.requests]:
            del self.prefilling[rid]
        return sum(self.prefilling.values())

    @property
    def accepting(self) -> bool:
        return self.state is WorkerState.RUNNING

    @property
    def gone(self) -> bool:
        """Its process exited or is shutting down: nothing more is sent to it, and the KV it published
        is the controller's to clean up."""
        return self.state in (WorkerState.FAILED, WorkerState.STOPPED)
