"""Where the console's data comes from and where its actions go: a fleet's HTTP API (`/fleet/*`, the typed
client), with history read from a local store when the console has one (faster, and the same function the
server's `/fleet/history` runs, validated into the same `FleetHistory`) or through `/fleet/history` when it is
attached from afar.

All I/O is async (the fleet client) or runs in a thread (SQLite, psutil), so the UI thread never waits. The history
is read beside the readings, not in them: each reading carries the newest history read so far and starts the next
read (every HISTORY_EVERY_S) if none is under way, so a slow store (or the first read's imports) never holds the
live numbers back — the first frame comes as soon as `/fleet/status` answers."""

import asyncio
import math
import time
from pathlib import Path
from typing import Protocol

from fleetctl.console.client import AsyncFleetClient, FleetClientError, FleetRefused
from fleetctl.console.tui.host import GpuSamples, HostProbe
from fleetctl.console.tui.reading import HISTORY_BUCKET_S, HISTORY_PENDING, HISTORY_WINDOW_S, FleetReading
from fleetctl.engine.api.checkpoints import CheckpointList
from fleetctl.engine.api.history import FleetHistory
from fleetctl.engine.api.operation_results import RebalancePreview
from fleetctl.engine.api.operations import OperationInfo
from fleetctl.engine.api.reports import FleetPlan
from fleetctl.engine.api.requests import RecentRequests
from fleetctl.engine.api.status import FleetLogLines, WorkerSessions

# the history's charts move a 5 s bucket at a time: read it every other second, not at every reading
HISTORY_EVERY_S = 2.0


class FleetSource(Protocol):
    """What the console reads and where its actions go; every call but `read` raises FleetClientError."""

    url: str

    async def read(self) -> FleetReading: ...

    async def start(self, path: str, body: dict[str, object]) -> OperationInfo: ...

    async def operation(self, op_id: str) -> OperationInfo: ...

    async def sessions(self, worker: str) -> WorkerSessions: ...

    async def logs(self, worker: str | None, since: int) -> FleetLogLines: ...

    async def requests(self, limit: int) -> RecentRequests: ...

    async def checkpoints(self) -> CheckpointList: ...

    async def plan(self, since: str) -> FleetPlan: ...

    async def rebalance_preview(self, split: str) -> RebalancePreview: ...

    async def close(self) -> None: ...


class HttpSource:
    def __init__(self, url: str, token: str | None, store: Path | None = None, timeout_s: float = 5.0,
                 gpus: GpuSamples | None = None) -> None:
        self._fleet = AsyncFleetClient(url, token=token, timeout=timeout_s)
        self.url = self._fleet.url
        self._store = store
        self._host = HostProbe(gpus)
        self._history: FleetHistory | None = None  # the newest history read
        self._history_read = False  # one has finished (with a history or without one)
        self._history_task: asyncio.Task[None] | None = None
        self._history_at = -math.inf  # time.monotonic() the last history read started

    async def read(self) -> FleetReading:
        try:
            status = await self._fleet.status()
        except FleetRefused as exc:
            return FleetReading(reachable=False, error=f"{self.url} answered HTTP {exc.status}")
        except FleetClientError as exc:
            return FleetReading(reachable=False, error=str(exc))
        now = time.monotonic()
        if (self._history_task is None or self._history_task.done()) and now - self._history_at >= HISTORY_EVERY_S:
            self._history_task, self._history_at = asyncio.create_task(self._read_history()), now
        host = await asyncio.to_thread(self._host.sample, [w.pid for w in status.workers if w.pid])
        extra = {} if self._history_read else {"history_note": HISTORY_PENDING}
        return FleetReading(reachable=True, status=status, history=self._history, host=host, **extra)

    async def _read_history(self) -> None:
        self._history, self._history_read = await self._fetch_history(), True

    async def _fetch_history(self) -> FleetHistory | None:
        if self._store is not None and self._store.exists():
            return await asyncio.to_thread(_local_history, self._store)
        try:
            return await self._fleet.history({"since": HISTORY_WINDOW_S, "bucket": HISTORY_BUCKET_S})
        except FleetClientError:
            return None

    async def start(self, path: str, body: dict[str, object]) -> OperationInfo:
        return await self._fleet.start(path, body)

    async def operation(self, op_id: str) -> OperationInfo:
        return await self._fleet.operation(op_id)

    async def sessions(self, worker: str) -> WorkerSessions:
        return await self._fleet.sessions(worker)

    async def logs(self, worker: str | None, since: int) -> FleetLogLines:
        params: dict[str, str | float] = {"since": since, "limit": 1000}
        if worker is not None:
            params["worker"] = worker
        return await self._fleet.logs(params)

    async def requests(self, limit: int) -> RecentRequests:
        return await self._fleet.requests({"limit": limit})

    async def checkpoints(self) -> CheckpointList:
        return await self._fleet.checkpoints()

    async def plan(self, since: str) -> FleetPlan:
        return await self._fleet.plan({"since": since})

    async def rebalance_preview(self, split: str) -> RebalancePreview:
        return await self._fleet.rebalance_preview(split)

    async def close(self) -> None:
        if self._history_task is not None:
            self._history_task.cancel()
        await self._fleet.close()
        self._host.close()


def _local_history(path: Path) -> FleetHistory:
    from fleetctl.store.db import open_db
    from fleetctl.store.history import history

    db = open_db(path, check_same_thread=False)
    try:
        return FleetHistory.model_validate(history(db, HISTORY_WINDOW_S, HISTORY_BUCKET_S))
    finally:
        db.close()
