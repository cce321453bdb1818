"""/fleet/plan and /fleet/rebalance: the planner's recommendation for this fleet (query parameters as
`fleetctl plan`'s options; the JSON is `plan --json`'s) and the move to another split (a dry run that
lists the moves, or 202 and an operation to poll)."""

import asyncio

from fastapi import APIRouter, Query, Response

from fleetctl.domain import WorkerState
from fleetctl.engine.api.bodies import RebalanceBody
from fleetctl.engine.api.operation_results import RebalancePreview
from fleetctl.engine.api.operations import OperationInfo
from fleetctl.engine.api.reports import FleetPlan
from fleetctl.engine.fleet.controller import Fleet
from fleetctl.engine.fleet.errors import OperationRefused
from fleetctl.engine.planner.durations import parse_window
from fleetctl.engine.planner.plan import PlanRequest, plan_from_store
from fleetctl.engine.planner.simulator import EngineLimits
from fleetctl.engine.planner.slo import Slo
from fleetctl.engine.server.errors import APIError
from fleetctl.engine.server.store_routes import fleet_store
from fleetctl.errors import UserError
from fleetctl.store.plan_inputs import LiveWorker


def plan_router(fleet: Fleet) -> APIRouter:
    router = APIRouter()

    @router.get("/plan")
    async def plan(since: str = Query(default="10m"), slo_ttft: str = Query(default="2s"),
                   slo_tpot: str = Query(default="200ms"), devices: str | None = Query(default=None),
                   elastic: bool = Query(default=False)) -> FleetPlan:
        """The plan over the last `since` of the store for this fleet's live workers (or `devices`); elastic
        (layouts on any number of the devices) when asked, or over the free devices of its pool too when it
        has some and no `devices` are given."""
        path = fleet_store(fleet, "nothing to plan from")
        engine = fleet.config.engine
        workers = [LiveWorker(v.worker_id, v.role, v.device) for v in fleet.views.values()
                   if v.state in (WorkerState.RUNNING, WorkerState.DRAINING)]
        settings = fleet.config.autoplan
        pool = None if devices else fleet.elastic_devices(settings.max_workers if settings else None)
        try:
            request = PlanRequest(Slo.parse(slo_ttft, slo_tpot), ",".join(pool) if pool else devices,
                                  limits=EngineLimits(engine.max_num_seqs, engine.max_num_batched_tokens),
                                  elastic=elastic or pool is not None)
            result = await asyncio.to_thread(plan_from_store, path, parse_window(since), request, workers)
        except UserError as exc:
            raise APIError(400, str(exc), "invalid_request_error") from None
        return FleetPlan.model_validate(result.as_json())

    @router.post("/rebalance", responses={202: {"model": OperationInfo, "description": "the rebalance started"}})
    async def rebalance(body: RebalanceBody, response: Response) -> RebalancePreview | OperationInfo:
        """A dry run (200: the role changes it would make) unless `apply` (202: the operation to poll)."""
        try:
            if not body.apply:
                return fleet.rebalance_preview(body.split, body.force, body.via)
            op = fleet.rebalance(body.split, body.force, body.via)
        except OperationRefused as exc:
            raise APIError(exc.status, str(exc), "invalid_request_error") from None
        response.status_code = 202
        response.headers["Location"] = f"/fleet/operations/{op.id}"
        return op.info()

    return router
