"""/fleet/classify and /fleet/devices: what `fleetctl classify` and `fleetctl devices` read from a store file,
read from this fleet's own store (the JSON is their `--json`), for clients on another machine (404 for a fleet
that keeps none)."""

from fastapi import APIRouter, Query

from fleetctl.engine.api.reports import DevicePeaks, FleetClassification
from fleetctl.engine.server.depends import ServedFleet

router = APIRouter()


@router.get("/classify")
async def traffic_by_phase(fleet: ServedFleet, since: str = Query(default="10m")) -> FleetClassification:
    """Model time by phase over the last `since` of the store, overall and by length bucket."""
    return await fleet.classify(since)


@router.get("/devices")
async def device_peaks(fleet: ServedFleet) -> DevicePeaks:
    """The peaks the store holds per device identity and dtype (calibrated or from the spec table), and the
    workers on the devices with the weight format each serves."""
    return await fleet.device_peaks()
