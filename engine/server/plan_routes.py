"""/fleet/plan and /fleet/rebalance: the planner's recommendation for this fleet (query parameters as
`fleetctl plan`'s options; the JSON is `plan --json`'s) and the move to another split (a dry run that
lists the moves, or 202 and an operation to poll)."""

from fastapi import APIRouter, Query, Response

from fleetctl.engine.api.bodies import RebalanceBody
from fleetctl.engine.api.operation_results import RebalancePreview
from fleetctl.engine.api.operations import OperationInfo
from fleetctl.engine.api.reports import FleetPlan
from fleetctl.engine.server.depends import ServedFleet

router = APIRouter()


@router.get("/plan")
async def plan(fleet: ServedFleet, since: str = Query(default="10m"), slo_ttft: str = Query(default="2s"),
               slo_tpot: str = Query(default="200ms"), devices: str | None = Query(default=None),
               elastic: bool = Query(default=False)) -> FleetPlan:
    """The plan over the last `since` of the store for this fleet's live workers (or `devices`); elastic
    (layouts on any number of the devices) when asked, or over the free devices of its pool too when it
    has some and no `devices` are given."""
    return await fleet.plan(since, (slo_ttft, slo_tpot), devices, elastic)


@router.post("/rebalance", responses={202: {"model": OperationInfo, "description": "the rebalance started"}})
async def rebalance(body: RebalanceBody, response: Response, fleet: ServedFleet) -> RebalancePreview | OperationInfo:
    """A dry run (200: the role changes it would make) unless `apply` (202: the operation to poll)."""
    if not body.apply:
        return fleet.rebalance_preview(body.split, body.force, body.via)
    op = fleet.rebalance(body.split, body.force, body.via)
    response.status_code = 202
    response.headers["Location"] = f"/fleet/operations/{op.id}"
    return op
