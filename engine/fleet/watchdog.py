"""Hung workers: a running worker sends something (a step report, a heartbeat) at least every
`Supervision.heartbeat_s`, also during long steps; one silent for `heartbeat_timeout_s` is stopped
(SIGSTOP), deadlocked or stuck in a step past its timeout. It is killed: its exit then runs the usual
recovery (its sessions recomputed on peers) and the supervisor restarts it."""

import asyncio
import logging
import time

from fleetctl.domain import WorkerState
from fleetctl.engine.fleet.worker_link import WorkerLink
from fleetctl.engine.fleet.worker_view import WorkerView

log = logging.getLogger(__name__)
WATCHED = (WorkerState.RUNNING, WorkerState.DRAINING)


class Watchdog:
    def __init__(self, views: dict[str, WorkerView], links: dict[str, WorkerLink], timeout_s: float) -> None:
        self.views = views  # FleetState's tables, not copies: a worker added later is watched too
        self.links = links
        self.timeout_s = timeout_s

    def heard(self, worker_id: str) -> None:
        self.views[worker_id].last_heard = time.monotonic()

    def check(self) -> list[str]:
        """Kill every watched worker silent for longer than the timeout; returns their ids."""
        now = time.monotonic()
        killed = []
        for view in self.views.values():
            link = self.links.get(view.worker_id)
            silent = now - view.last_heard
            if view.state not in WATCHED or link is None or link.closed or silent <= self.timeout_s:
                continue
            if not view.last_error.startswith("no heartbeat"):
                view.last_error = f"no heartbeat for {silent:.1f} s (hung or stopped): killed"
                log.warning("worker %s: %s", view.worker_id, view.last_error)
            link.kill()
            killed.append(view.worker_id)
        return killed

    async def run(self) -> None:
        while True:
            await asyncio.sleep(min(1.0, self.timeout_s / 4))
            self.check()
