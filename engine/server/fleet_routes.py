"""/fleet/*: the fleet's status and workers, its long operations (checkpoint, restore, migrate, a session's
live move, and the pool changes start, drain, resume, stop, switch: 202 and an operation id to poll), checkpoints,
recent requests' timing breakdowns, the store's history for remote consoles, the planner's routes
(`plan_routes`) and the store's other reports (`store_routes`)."""

import asyncio
from collections.abc import Callable

from fastapi import APIRouter, Query, Response

from fleetctl.engine.api.bodies import (
    CheckpointBody,
    DrainBody,
    MigrateBody,
    MoveBody,
    RestoreBody,
    StartBody,
    StopBody,
    SwitchBody,
)
from fleetctl.engine.api.checkpoints import CheckpointList
from fleetctl.engine.api.history import FleetHistory
from fleetctl.engine.api.operations import OperationInfo
from fleetctl.engine.api.requests import RecentRequests
from fleetctl.engine.api.status import FleetLogLines, FleetStatus, LogLineInfo, WorkerList, WorkerSessions
from fleetctl.engine.fleet.controller import Fleet
from fleetctl.engine.fleet.errors import OperationRefused
from fleetctl.engine.fleet.logs import FLEET, KEEP_LINES
from fleetctl.engine.fleet.ops.checkpoint_catalog import catalog
from fleetctl.engine.fleet.ops.record import Operation
from fleetctl.engine.server.errors import APIError
from fleetctl.engine.server.plan_routes import plan_router
from fleetctl.engine.server.status import fleet_status, workers_status
from fleetctl.engine.server.store_routes import fleet_store, store_router
from fleetctl.errors import UserError
from fleetctl.store.db import read_store
from fleetctl.store.history import history

MAX_HISTORY_S = 7 * 86400.0  # what the store keeps


def refused(exc: OperationRefused) -> APIError:
    kind = "not_found_error" if exc.status == 404 else "invalid_request_error"
    return APIError(exc.status, str(exc), kind)


def accepted(op: Operation, response: Response) -> OperationInfo:
    """202: the operation started; poll its Location."""
    response.headers["Location"] = f"/fleet/operations/{op.id}"
    return op.info()


def fleet_router(fleet: Fleet) -> APIRouter:
    router = APIRouter(prefix="/fleet")

    def start(operation: Callable[[], Operation], response: Response) -> OperationInfo:
        try:
            op = operation()
        except OperationRefused as exc:
            raise refused(exc) from None
        return accepted(op, response)

    @router.get("/status")
    async def status() -> FleetStatus:
        return fleet_status(fleet)

    @router.get("/workers")
    async def workers() -> WorkerList:
        return WorkerList(workers=workers_status(fleet))

    @router.get("/logs")
    async def logs(worker: str | None = None, since: int = Query(default=0, ge=0),
                   limit: int = Query(default=200, ge=0, le=KEEP_LINES)) -> FleetLogLines:
        """The fleet's (`worker=fleet`) and its workers' recent log lines after `since`, the last `limit`."""
        if worker is not None and worker != FLEET and worker not in fleet.views:
            raise APIError(404, f"unknown worker {worker!r}", "not_found_error")
        lines, newest = fleet.log_lines(worker, since, limit)
        return FleetLogLines(lines=[LogLineInfo(seq=ln.seq, time=ln.time, source=ln.source, level=ln.level.value,
                                                text=ln.text) for ln in lines],
                             next=max(since, newest))

    @router.get("/workers/{worker_id}/sessions")
    async def sessions(worker_id: str) -> WorkerSessions:
        if worker_id not in fleet.views:
            raise APIError(404, f"unknown worker {worker_id!r}", "not_found_error")
        return WorkerSessions.model_validate({"worker": worker_id, "sessions": fleet.sessions(worker_id)})

    @router.post("/workers", status_code=202)
    async def start_worker(body: StartBody, response: Response) -> OperationInfo:
        return start(lambda: fleet.start_worker(body.role, body.device), response)

    @router.post("/workers/{worker_id}/drain", status_code=202)
    async def drain(worker_id: str, response: Response, body: DrainBody | None = None) -> OperationInfo:
        return start(lambda: fleet.drain_worker(worker_id, body.move if body else False), response)

    @router.post("/workers/{worker_id}/resume", status_code=202)
    async def resume(worker_id: str, response: Response) -> OperationInfo:
        return start(lambda: fleet.resume_worker(worker_id), response)

    @router.post("/workers/{worker_id}/stop", status_code=202)
    async def stop(worker_id: str, response: Response, body: StopBody | None = None) -> OperationInfo:
        force = body.force if body else False
        return start(lambda: fleet.stop_worker(worker_id, force), response)

    @router.post("/workers/{worker_id}/switch", status_code=202)
    async def switch(worker_id: str, body: SwitchBody, response: Response) -> OperationInfo:
        return start(lambda: fleet.switch_worker(worker_id, body.role), response)

    @router.post("/workers/{worker_id}/checkpoint", status_code=202)
    async def checkpoint(worker_id: str, response: Response, body: CheckpointBody | None = None) -> OperationInfo:
        return start(lambda: fleet.checkpoint(worker_id, body.hold_s if body else None), response)

    @router.post("/workers/{worker_id}/migrate", status_code=202)
    async def migrate(worker_id: str, body: MigrateBody, response: Response) -> OperationInfo:
        return start(lambda: fleet.migrate(worker_id, body.to, body.via == "checkpoint"), response)

    @router.post("/restore", status_code=202)
    async def restore(body: RestoreBody, response: Response) -> OperationInfo:
        try:
            op = await fleet.restore(body.checkpoint, body.device, body.force)
        except OperationRefused as exc:
            raise refused(exc) from None
        return accepted(op, response)

    @router.get("/checkpoints")
    async def checkpoints() -> CheckpointList:
        rows = await asyncio.to_thread(catalog)  # verifies (hashes) every checkpoint
        return CheckpointList.model_validate({"checkpoints": rows})

    @router.get("/operations/{op_id}")
    async def get_operation(op_id: str) -> OperationInfo:
        try:
            return fleet.operation(op_id).info()
        except OperationRefused as exc:
            raise refused(exc) from None

    @router.get("/requests")
    async def recent_requests(limit: int = Query(default=100, ge=0, le=10_000)) -> RecentRequests:
        """Timing breakdowns of the most recently finished requests (newest last), and of those in flight."""
        records = list(fleet.stats.records)
        return RecentRequests.model_validate({"requests": records[-limit:] if limit else [],
                                              "live": fleet.live_requests()})

    @router.post("/requests/{request_id}/move", status_code=202)
    async def move(request_id: str, body: MoveBody, response: Response) -> OperationInfo:
        return start(lambda: fleet.move_session(request_id, body.to), response)

    @router.get("/history")
    async def store_history(since: float = Query(default=300.0, gt=0, le=MAX_HISTORY_S),
                            bucket: float = Query(default=5.0, ge=1)) -> FleetHistory:
        """Series, traffic and events of the last `since` seconds from the metrics store (`store.history`)."""
        path = fleet_store(fleet, "no history")
        if bucket > since:
            raise APIError(400, f"bucket ({bucket:g} s) must not be longer than since ({since:g} s)",
                           "invalid_request_error")
        try:
            return FleetHistory.model_validate(
                await asyncio.to_thread(read_store, path, lambda db: history(db, since, bucket)))
        except UserError as exc:
            raise APIError(400, str(exc), "invalid_request_error") from None

    router.include_router(plan_router(fleet))  # /fleet/plan, /fleet/rebalance
    router.include_router(store_router(fleet))  # /fleet/classify, /fleet/devices
    return router
