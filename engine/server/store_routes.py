"""/fleet/classify and /fleet/devices: what `fleetctl classify` and `fleetctl devices` read from a store file,
read from this fleet's own store (the JSON is their `--json`), for clients on another machine; and
`fleet_store`, the store every store-backed route reads (404 for a fleet that keeps none)."""

import asyncio
from pathlib import Path

from fastapi import APIRouter, Query

from fleetctl.engine.api.reports import DevicePeak, DevicePeaks, DeviceWorker, FleetClassification
from fleetctl.engine.fleet.controller import Fleet
from fleetctl.engine.planner.durations import parse_window
from fleetctl.engine.server.errors import APIError
from fleetctl.errors import UserError
from fleetctl.store.classify import classify
from fleetctl.store.db import read_store
from fleetctl.store.device_peak_cache import all_devices, peak_report


def fleet_store(fleet: Fleet, missing: str) -> Path:
    """The fleet's metrics store; a 404 saying it keeps none, so it has `missing`."""
    path = fleet.config.store_path
    if path is None:
        raise APIError(404, f"this fleet keeps no metrics store, so it has {missing}", "not_found_error")
    return path


def store_router(fleet: Fleet) -> APIRouter:
    router = APIRouter()

    @router.get("/classify")
    async def traffic_by_phase(since: str = Query(default="10m")) -> FleetClassification:
        """Model time by phase over the last `since` of the store, overall and by length bucket."""
        path = fleet_store(fleet, "no traffic to classify")
        try:
            window_s = parse_window(since)
        except UserError as exc:
            raise APIError(400, str(exc), "invalid_request_error") from None
        classified = await asyncio.to_thread(read_store, path, lambda db: classify(db, window_s))
        return FleetClassification.model_validate(classified.as_json())

    @router.get("/devices")
    async def device_peaks() -> DevicePeaks:
        """The peaks the store holds per device identity and dtype (calibrated or from the spec table), and the
        workers on the devices with the weight format each serves."""
        records = await asyncio.to_thread(read_store, fleet_store(fleet, "no device peaks"), all_devices)
        workers = [DeviceWorker(id=v.worker_id, role=v.role.value, device=v.device, device_name=v.device_name,
                                weights=v.weights) for v in sorted(fleet.views.values(), key=lambda v: v.worker_id)]
        peaks = [DevicePeak.model_validate(peak_report(record)) for record in records]
        return DevicePeaks(devices=peaks, not_recalibrated=[], workers=workers)

    return router
