"""/fleet/*: the fleet's status and workers, its long operations (checkpoint, restore, migrate, a session's
live move, and the pool changes start, drain, resume, stop, switch: 202 and an operation id to poll), checkpoints,
recent requests' timing breakdowns, the store's history for remote consoles, the planner's routes
(`plan_routes`) and the store's other reports (`store_routes`)."""

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
from fleetctl.engine.api.status import FleetLogLines, FleetStatus, WorkerList, WorkerSessions
from fleetctl.engine.fleet.logs import KEEP_LINES
from fleetctl.engine.server import plan_routes, store_routes
from fleetctl.engine.server.depends import ServedFleet

MAX_HISTORY_S = 7 * 86400.0  # what the store keeps

router = APIRouter(prefix="/fleet")


def accepted(op: OperationInfo, response: Response) -> OperationInfo:
    """202: the operation started; poll its Location."""
    response.headers["Location"] = f"/fleet/operations/{op.id}"
    return op


@router.get("/status")
async def status(fleet: ServedFleet) -> FleetStatus:
    return fleet.status()


@router.get("/workers")
async def workers(fleet: ServedFleet) -> WorkerList:
    return WorkerList(workers=fleet.workers())


@router.get("/logs")
async def logs(fleet: ServedFleet, worker: str | None = None, since: int = Query(default=0, ge=0),
               limit: int = Query(default=200, ge=0, le=KEEP_LINES)) -> FleetLogLines:
    """The fleet's (`worker=fleet`) and its workers' recent log lines after `since`, the last `limit`."""
    return fleet.log_lines(worker, since, limit)


@router.get("/workers/{worker_id}/sessions")
async def sessions(worker_id: str, fleet: ServedFleet) -> WorkerSessions:
    return fleet.sessions(worker_id)


@router.post("/workers", status_code=202)
async def start_worker(body: StartBody, response: Response, fleet: ServedFleet) -> OperationInfo:
    return accepted(fleet.start_worker(body.role, body.device), response)


@router.post("/workers/{worker_id}/drain", status_code=202)
async def drain(worker_id: str, response: Response, fleet: ServedFleet, body: DrainBody | None = None) -> OperationInfo:
    return accepted(fleet.drain_worker(worker_id, body.move if body else False), response)


@router.post("/workers/{worker_id}/resume", status_code=202)
async def resume(worker_id: str, response: Response, fleet: ServedFleet) -> OperationInfo:
    return accepted(fleet.resume_worker(worker_id), response)


@router.post("/workers/{worker_id}/stop", status_code=202)
async def stop(worker_id: str, response: Response, fleet: ServedFleet, body: StopBody | None = None) -> OperationInfo:
    return accepted(fleet.stop_worker(worker_id, body.force if body else False), response)


@router.post("/workers/{worker_id}/switch", status_code=202)
async def switch(worker_id: str, body: SwitchBody, response: Response, fleet: ServedFleet) -> OperationInfo:
    return accepted(fleet.switch_worker(worker_id, body.role), response)


@router.post("/workers/{worker_id}/checkpoint", status_code=202)
async def checkpoint(worker_id: str, response: Response, fleet: ServedFleet,
                     body: CheckpointBody | None = None) -> OperationInfo:
    return accepted(fleet.checkpoint(worker_id, body.hold_s if body else None), response)


@router.post("/workers/{worker_id}/migrate", status_code=202)
async def migrate(worker_id: str, body: MigrateBody, response: Response, fleet: ServedFleet) -> OperationInfo:
    return accepted(fleet.migrate(worker_id, body.to, body.via == "checkpoint"), response)


@router.post("/restore", status_code=202)
async def restore(body: RestoreBody, response: Response, fleet: ServedFleet) -> OperationInfo:
    return accepted(await fleet.restore(body.checkpoint, body.device, body.force), response)


@router.get("/checkpoints")
async def checkpoints(fleet: ServedFleet) -> CheckpointList:
    return await fleet.checkpoint_catalog()


@router.get("/operations/{op_id}")
async def get_operation(op_id: str, fleet: ServedFleet) -> OperationInfo:
    return fleet.operation(op_id)


@router.get("/requests")
async def recent_requests(fleet: ServedFleet, limit: int = Query(default=100, ge=0, le=10_000)) -> RecentRequests:
    """Timing breakdowns of the most recently finished requests (newest last), and of those in flight."""
    return fleet.recent_requests(limit)


@router.post("/requests/{request_id}/move", status_code=202)
async def move(request_id: str, body: MoveBody, response: Response, fleet: ServedFleet) -> OperationInfo:
    return accepted(fleet.move_session(request_id, body.to), response)


@router.get("/history")
async def store_history(fleet: ServedFleet, since: float = Query(default=300.0, gt=0, le=MAX_HISTORY_S),
                        bucket: float = Query(default=5.0, ge=1)) -> FleetHistory:
    """Series, traffic and events of the last `since` seconds from the metrics store (`store.history`)."""
    return await fleet.history(since, bucket)


router.include_router(plan_routes.router)  # /fleet/plan, /fleet/rebalance
router.include_router(store_routes.router)  # /fleet/classify, /fleet/devices
