"""The worker a pool should look at: among a pool's running workers, the one whose busy share lies farthest from
its peers' median — by at least IMBALANCE_BUSY — or, failing that, one that holds at least twice its peers' median
sessions (and IMBALANCE_SESSIONS more). A stalled worker is named by its own signal (fleet/stalls.py) and an
idle pool has nothing to compare: vllm-htop's "slow replica", said in one line of `/fleet/status`."""

from statistics import median

from fleetctl.engine.api.status import WorkerInfo

IMBALANCE_BUSY = 0.3  # busy share apart from the peers' median
IMBALANCE_SESSIONS = 4  # sessions above the peers' median (and at least twice it)


def outlier(members: list[WorkerInfo]) -> str | None:
    """A sentence naming the pool's outlier, or None while its running workers agree."""
    if len(members) < 2:
        return None
    by_busy = max(members, key=lambda w: (abs(w.busy - _peers(members, w, "busy")), w.busy))  # a tie: the busier
    peers_busy = _peers(members, by_busy, "busy")
    if abs(by_busy.busy - peers_busy) >= IMBALANCE_BUSY:
        return f"{by_busy.id} busy {by_busy.busy:.0%} against {peers_busy:.0%} for its peers"
    by_sessions = max(members, key=lambda w: (w.sessions, w.id))
    peers_sessions = _peers(members, by_sessions, "sessions")
    if by_sessions.sessions >= max(2 * peers_sessions, peers_sessions + IMBALANCE_SESSIONS):
        return f"{by_sessions.id} holds {by_sessions.sessions} sessions against {peers_sessions:g} for its peers"
    return None


def _peers(members: list[WorkerInfo], worker: WorkerInfo, field: str) -> float:
    """The median of `field` over the pool's other running workers."""
    return median(getattr(w, field) for w in members if w is not worker)
