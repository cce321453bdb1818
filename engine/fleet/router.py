"""Routing decisions only: which worker gets a prompt, which takes a handoff. No I/O.

KV-aware: a request's `CachedTokens` says how many of its leading tokens each worker's prefix cache
holds (from the digests workers report), and the node's KV tiers after them at a discount (read back, not
computed: `kv_tiers/presence`). Overlap alone would pile every conversation onto the worker
that saw its system prompt first, so each pick weighs it against load:
Mixed workers count as both: they take prompts beside prefill workers and handoffs beside decode ones.
- a prompt goes to the prefill or mixed worker where it would finish prefilling soonest, in tokens: the
  tokens that worker has still to prefill for others plus the ones this prompt would compute there
  (its length less what that worker caches). A busy worker holding the prefix loses to an idle one
  without it once its backlog exceeds what the cache saves.
- a handoff (or a recompute) goes to the decode or mixed worker caching the most of it among those holding
  at most `decode_load_slack` sessions more than the least-loaded one: a session stays where its
  conversation is unless that worker is overloaded.
"""

from collections.abc import Callable
from dataclasses import dataclass

from fleetctl.domain import WorkerRole, WorkerState
from fleetctl.engine.core.block_allocator import blocks_for
from fleetctl.engine.fleet.worker_view import WorkerView

# leading tokens of one request a worker caches (fractional: a token the node's KV tiers hold counts in part)
CachedTokens = Callable[[WorkerView], float]


def _nothing_cached(_: WorkerView) -> float:
    return 0


@dataclass(frozen=True)
class RouterConfig:
    max_requests_per_worker: int = 128  # beyond this, prompts wait in the controller's queue
    decode_load_slack: int = 4  # sessions beyond the least-loaded decode worker's that a cache hit may cost


class Router:
    def __init__(self, config: RouterConfig = RouterConfig()) -> None:
        self.config = config

    def pick_prefill_worker(self, views: list[WorkerView], avoid: set[str] | frozenset[str] = frozenset(),
                            num_tokens: int = 0, cached: CachedTokens = _nothing_cached,
                            near: set[str] | frozenset[str] = frozenset()) -> WorkerView | None:
        """The accepting prefill or mixed worker with room where a prompt of `num_tokens` would be prefilled
        soonest: fewest tokens of backlog plus uncached prompt, then fewest requests; one not in `avoid`
        (workers the request failed on) if there is one, and one in `near` (holding its siblings: their
        prompt's KV) if there is one."""
        candidates = _preferred([v for v in views if v.role.covers(WorkerRole.PREFILL) and v.accepting
                                 and len(v.requests) < self.config.max_requests_per_worker], avoid)
        candidates = [v for v in candidates if v.worker_id in near] or candidates
        return min(candidates, default=None, key=lambda v: (
            v.prefill_backlog() + max(0, num_tokens - cached(v)), len(v.requests), v.worker_id))

    def pick_decode_worker(self, views: list[WorkerView], num_tokens: int,
                           avoid: set[str] | frozenset[str] = frozenset(),
                           cached: CachedTokens = _nothing_cached,
                           near: set[str] | frozenset[str] = frozenset()) -> WorkerView | None:
        """The accepting decode (or mixed) worker with blocks available for `num_tokens` tokens that caches most of
        them, among those within `decode_load_slack` sessions of the least loaded; then least loaded, most available
        blocks (one not in `avoid` if there is one; one in `near`, holding its siblings, if there is one)."""
        candidates = _preferred([v for v in views if v.role.covers(WorkerRole.DECODE) and v.accepting
                                 and v.kv.available >= blocks_for(num_tokens, v.kv.block_size)], avoid)
        candidates = [v for v in candidates if v.worker_id in near] or candidates
        if not candidates:
            return None
        least = min(len(v.requests) for v in candidates)
        unloaded = [v for v in candidates if len(v.requests) <= least + self.config.decode_load_slack]
        return min(unloaded, key=lambda v: (-cached(v), len(v.requests), -v.kv.available, v.worker_id))

    @staticmethod
    def covered(views: list[WorkerView], phase: WorkerRole) -> bool:
        """A running (or starting) worker does `phase`'s work (see WorkerRole.covers)."""
        return any(v.role.covers(phase) and v.state in (WorkerState.RUNNING, WorkerState.STARTING) for v in views)


def _preferred(candidates: list[WorkerView], avoid: set[str] | frozenset[str]) -> list[WorkerView]:
    return [v for v in candidates if v.worker_id not in avoid] or candidates
