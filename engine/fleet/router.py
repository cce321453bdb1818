"""Routing decisions only: which worker gets a prompt, which takes a handoff. No I/O."""

from dataclasses import dataclass, field

from fleetctl.engine.core.block_allocator import BLOCK_SIZE, blocks_for
from fleetctl.store.records import WorkerRole, WorkerState


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
    num_kv_blocks: int = 0
    block_size: int = BLOCK_SIZE
    free_blocks: int = 0
    running: int = 0
    waiting: int = 0
    requests: set[str] = field(default_factory=set)  # request ids this worker holds
    device_name: str = ""
    peak_flops: float = 0.0
    peak_bytes_per_s: float = 0.0
    last_error: str = ""  # why the worker's last process exited, in its own words
    last_heard: float = 0.0  # time.monotonic() of its last message (the watchdog's clock)

    @property
    def accepting(self) -> bool:
        return self.state is WorkerState.RUNNING

    @property
    def gone(self) -> bool:
        """Its process exited or is shutting down: nothing more is sent to it, and the KV it published
        is the controller's to clean up."""
        return self.state in (WorkerState.FAILED, WorkerState.STOPPED)

    @property
    def kv_usage(self) -> float:
        return 1 - self.free_blocks / self.num_kv_blocks if self.num_kv_blocks else 0.0


@dataclass(frozen=True)
class RouterConfig:
    max_requests_per_worker: int = 128  # beyond this, prompts wait in the controller's queue


class Router:
    def __init__(self, config: RouterConfig = RouterConfig()) -> None:
        self.config = config

    def pick_prefill_worker(self, views: list[WorkerView], role: WorkerRole,
                            avoid: set[str] | frozenset[str] = frozenset(),
                            near: set[str] | frozenset[str] = frozenset()) -> WorkerView | None:
        """The accepting worker of `role` (prefill, mixed, or decode for a recompute) holding the fewest
        requests, if any has room; one not in `avoid` (workers the request failed on) if there is one, and
        one in `near` (holding its siblings: their prompt's KV) if there is one."""
        candidates = _preferred([v for v in views if v.role is role and v.accepting
                                 and len(v.requests) < self.config.max_requests_per_worker], avoid)
        candidates = [v for v in candidates if v.worker_id in near] or candidates
        return min(candidates, key=lambda v: (len(v.requests), v.worker_id), default=None)

    def pick_decode_worker(self, views: list[WorkerView], num_tokens: int,
                           avoid: set[str] | frozenset[str] = frozenset(),
                           near: set[str] | frozenset[str] = frozenset()) -> WorkerView | None:
        """The accepting decode worker with free blocks for `num_tokens` tokens, least loaded first (one
        not in `avoid` if there is one, one in `near` if there is one)."""
        candidates = _preferred([v for v in views if v.role is WorkerRole.DECODE and v.accepting
                                 and v.free_blocks >= blocks_for(num_tokens, v.block_size)], avoid)
        candidates = [v for v in candidates if v.worker_id in near] or candidates
        return min(candidates, key=lambda v: (len(v.requests), -v.free_blocks, v.worker_id), default=None)

    @staticmethod
    def has_role(views: list[WorkerView], role: WorkerRole) -> bool:
        return any(v.role is role and v.state in (WorkerState.RUNNING, WorkerState.STARTING) for v in views)


def _preferred(candidates: list[WorkerView], avoid: set[str] | frozenset[str]) -> list[WorkerView]:
    return [v for v in candidates if v.worker_id not in avoid] or candidates
