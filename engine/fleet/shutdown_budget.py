"""How `fleetctl serve` spends `--grace` seconds after SIGTERM or SIGINT, so that the whole way down fits in
them (a Kubernetes pod is killed 30 s after its SIGTERM; the default grace, 20 s, leaves room under that):

    streams   requests in flight finish, new ones get 503          grace − STOP_RESERVE_S (at least half)
    workers   asked to exit, killed once WORKER_EXIT_S has passed  what is left, less AFTER_KILL_S
    the rest  a killed worker reaped, shared memory swept, the store closed, the HTTP server closed"""

import time
from dataclasses import dataclass, field

DEFAULT_GRACE_S = 20.0
WORKER_EXIT_S = 2.0  # an idle worker exits in well under a second; one stuck in a step is killed after this
SERVER_CLOSE_S = 0.5  # connections still open once the fleet stopped (their requests all ended) get this long
AFTER_KILL_S = 1.0 + SERVER_CLOSE_S  # reaping a killed worker (up to 1 s), sweeping, closing store and server
STOP_RESERVE_S = WORKER_EXIT_S + AFTER_KILL_S + 0.5  # of the grace, kept from the streams for what follows them


@dataclass(frozen=True)
class ShutdownBudget:
    grace_s: float
    signalled_at: float = field(default_factory=time.monotonic)

    @property
    def streams_s(self) -> float:
        """Seconds the requests in flight get to finish."""
        return max(self.grace_s - STOP_RESERVE_S, self.grace_s / 2)

    def worker_exit_s(self) -> float:
        """Seconds, from now, the workers get to exit when asked before they are killed."""
        left = self.signalled_at + self.grace_s - time.monotonic() - AFTER_KILL_S
        return min(WORKER_EXIT_S, max(left, 0.0))
