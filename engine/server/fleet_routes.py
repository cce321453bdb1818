"""/fleet/*: the fleet's status and workers, its long operations (checkpoint, restore, migrate: 202 and
an operation id to poll), checkpoints, and recent requests' timing breakdowns."""

from collections.abc import Callable

from fastapi import APIRouter, Query
from fastapi.responses import JSONResponse
from pydantic import BaseModel, Field

from fleetctl.engine.fleet.controller import Fleet
from fleetctl.engine.fleet.operations import DEFAULT_HOLD_S, Operation, OperationError
from fleetctl.engine.server.errors import APIError
from fleetctl.engine.server.status import fleet_status, workers_status


class CheckpointBody(BaseModel):
    hold_s: float = Field(default=DEFAULT_HOLD_S, ge=0)


class MigrateBody(BaseModel):
    to: str


class RestoreBody(BaseModel):
    checkpoint: str
    device: str


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

    @router.post("/workers/{worker_id}/checkpoint")
    async def checkpoint(worker_id: str, body: CheckpointBody | None = None) -> JSONResponse:
        hold = body.hold_s if body else DEFAULT_HOLD_S
        return start(lambda: fleet.operations.checkpoint(worker_id, hold))

    @router.post("/workers/{worker_id}/migrate")
    async def migrate(worker_id: str, body: MigrateBody) -> JSONResponse:
        return start(lambda: fleet.operations.migrate(worker_id, body.to))

    @router.post("/restore")
    async def restore(body: RestoreBody) -> JSONResponse:
        return start(lambda: fleet.operations.restore(body.checkpoint, body.device))

    @router.get("/checkpoints")
    async def checkpoints() -> dict:
        return {"checkpoints": fleet.operations.list_checkpoints()}

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

    return router
