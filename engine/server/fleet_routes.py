"""/fleet/*: the fleet's status and workers, its long operations (checkpoint, restore, migrate, a session's
live move, and the pool changes start, drain, resume, stop: 202 and an operation id to poll), checkpoints,
recent requests' timing breakdowns, the store's history for remote consoles, and the planner's routes
(`plan_routes`)."""

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import Literal

from fastapi import APIRouter, Query
from fastapi.responses import JSONResponse
from pydantic import BaseModel, Field

from fleetctl.engine.fleet.checkpoint_catalog import catalog
from fleetctl.engine.fleet.controller import Fleet
from fleetctl.engine.fleet.operation import Operation, OperationError
from fleetctl.engine.fleet.operations import DEFAULT_HOLD_S
from fleetctl.engine.server.errors import APIError
from fleetctl.engine.server.plan_routes import plan_router
from fleetctl.engine.server.status import fleet_status, workers_status
from fleetctl.store.db import open_db
from fleetctl.store.history import HistoryError, history

MAX_HISTORY_S = 7 * 86400.0  # what the store keeps


class CheckpointBody(BaseModel):
    hold_s: float = Field(default=DEFAULT_HOLD_S, ge=0)


class MigrateBody(BaseModel):
    to: str
    via: Literal["live", "checkpoint"] = "live"  # checkpoint: the source pauses, its state goes through disk


class MoveBody(BaseModel):
    to: str  # a worker id of the session's role


class RestoreBody(BaseModel):
    checkpoint: str
    device: str
    force: bool = False  # replay its sessions even where that is refused (see checkpoint_catalog)


class StartBody(BaseModel):
    role: str  # checked by the operation, which knows the fleet's layout
    device: str


class DrainBody(BaseModel):
    move: bool = False  # move its decoding sessions to peers live rather than wait for them to finish


class StopBody(BaseModel):
    force: bool = False


def _operation_error(exc: OperationError) -> APIError:
    kind = "not_found_error" if exc.status == 404 else "invalid_request_error"
    return APIError(exc.status, str(exc), kind)


def fleet_router(fleet: Fleet) -> APIRouter:
    router = APIRouter(prefix="/fleet")

    def start(operation: Callable[[], Operation]) -> JSONResponse:
        try:
            op = operation()
        except OperationError as exc:
            raise _operation_error(exc) from None
        return JSONResponse(op.as_json(), 202, headers={"Location": f"/fleet/operations/{op.id}"})

    @router.get("/status")
    async def status() -> dict:
        return fleet_status(fleet)

    @router.get("/workers")
    async def workers() -> dict:
        return {"workers": workers_status(fleet)}

    @router.get("/workers/{worker_id}/sessions")
    async def sessions(worker_id: str) -> dict:
        if worker_id not in fleet.views:
            raise APIError(404, f"unknown worker {worker_id!r}", "not_found_error")
        return {"worker": worker_id, "sessions": fleet.sessions(worker_id)}

    @router.post("/workers")
    async def start_worker(body: StartBody) -> JSONResponse:
        return start(lambda: fleet.lifecycle.start(body.role, body.device))

    @router.post("/workers/{worker_id}/drain")
    async def drain(worker_id: str, body: DrainBody | None = None) -> JSONResponse:
        return start(lambda: fleet.lifecycle.drain(worker_id, body.move if body else False))

    @router.post("/workers/{worker_id}/resume")
    async def resume(worker_id: str) -> JSONResponse:
        return start(lambda: fleet.lifecycle.resume(worker_id))

    @router.post("/workers/{worker_id}/stop")
    async def stop(worker_id: str, body: StopBody | None = None) -> JSONResponse:
        force = body.force if body else False
        return start(lambda: fleet.lifecycle.stop(worker_id, force))

    @router.post("/workers/{worker_id}/checkpoint")
    async def checkpoint(worker_id: str, body: CheckpointBody | None = None) -> JSONResponse:
        hold = body.hold_s if body else DEFAULT_HOLD_S
        return start(lambda: fleet.checkpoints.checkpoint(worker_id, hold))

    @router.post("/workers/{worker_id}/migrate")
    async def migrate(worker_id: str, body: MigrateBody) -> JSONResponse:
        return start(lambda: fleet.checkpoints.migrate(worker_id, body.to, body.via == "checkpoint"))

    @router.post("/restore")
    async def restore(body: RestoreBody) -> JSONResponse:
        try:
            op = await fleet.checkpoints.restore(body.checkpoint, body.device, body.force)
        except OperationError as exc:
            raise _operation_error(exc) from None
        return start(lambda: op)

    @router.get("/checkpoints")
    async def checkpoints() -> dict:
        return {"checkpoints": await asyncio.to_thread(catalog)}  # verifies (hashes) every checkpoint

    @router.get("/operations/{op_id}")
    async def get_operation(op_id: str) -> dict:
        try:
            return fleet.operations.get(op_id).as_json()
        except OperationError as exc:
            raise _operation_error(exc) from None

    @router.get("/requests")
    async def recent_requests(limit: int = Query(default=100, ge=0, le=10_000)) -> dict:
        """Timing breakdowns of the most recently finished requests (newest last)."""
        records = list(fleet.stats.records)
        return {"requests": records[-limit:] if limit else []}

    @router.post("/requests/{request_id}/move")
    async def move(request_id: str, body: MoveBody) -> JSONResponse:
        return start(lambda: fleet.moves.move(request_id, body.to))

    @router.get("/history")
    async def store_history(since: float = Query(default=300.0, gt=0, le=MAX_HISTORY_S),
                            bucket: float = Query(default=5.0, ge=1)) -> dict:
        """Series, traffic and events of the last `since` seconds from the metrics store (`store.history`)."""
        path = fleet.config.store_path
        if path is None:
            raise APIError(404, "this fleet keeps no metrics store, so it has no history", "not_found_error")
        if bucket > since:
            raise APIError(400, f"bucket ({bucket:g} s) must not be longer than since ({since:g} s)",
                           "invalid_request_error")
        try:
            return await asyncio.to_thread(_read_history, path, since, bucket)
        except HistoryError as exc:
            raise APIError(400, str(exc), "invalid_request_error") from None

    router.include_router(plan_router(fleet))  # /fleet/plan, /fleet/rebalance
    return router


def _read_history(path: Path, since: float, bucket: float) -> dict:
    db = open_db(path)  # one connection per call, in the calling thread: reads never wait on the event loop
    try:
        return history(db, since, bucket)
    finally:
        db.close()
