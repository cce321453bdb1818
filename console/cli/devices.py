"""`fleetctl devices`: the device peaks behind every MFU and MBU (spec table or calibration, and when), from a
store file or asked of a fleet (`fleet_to_ask`), and `--recalibrate` to measure this machine's CPUs again on a
quiet machine (a store file's only: a fleet's peaks are its machine's, measured where it runs)."""

from __future__ import annotations

import json
import time
from typing import TYPE_CHECKING

import typer

from fleetctl.console.cli.common import (
    JSON_OPTION,
    REPORT_STORE_OPTION,
    REPORT_URL_OPTION,
    existing_store,
    fail,
    fleet_to_ask,
)
from fleetctl.console.client import FleetClient

if TYPE_CHECKING:
    from fleetctl.engine.api.reports import DevicePeaks


def devices(
    recalibrate: bool = typer.Option(False, "--recalibrate",
                                     help="Measure this machine's cached CPU peaks again (takes ~1 s each; "
                                          "a store file only)."),
    store: str = REPORT_STORE_OPTION,
    url: str | None = REPORT_URL_OPTION,
    as_json: bool = JSON_OPTION,
) -> None:
    """Peak FLOP/s and bytes/s per device identity and dtype: the MFU and MBU denominators (from a store file, or
    asked of a fleet, then with its workers' devices and weight formats)."""
    fleet = fleet_to_ask(store, url)
    if fleet is None:
        peaks = _peaks_in_file(store, recalibrate)
    elif recalibrate:
        raise fail("--recalibrate measures this machine's CPUs into a store file: pass --store, not a fleet's URL")
    else:
        peaks = FleetClient(fleet).devices()
    print(json.dumps(peaks.model_dump(mode="json")) if as_json else render_devices(peaks))


def _peaks_in_file(store: str, recalibrate: bool) -> DevicePeaks:
    from fleetctl.engine.api.reports import DevicePeak, DevicePeaks
    from fleetctl.store.db import read_store
    from fleetctl.store.device_peak_cache import all_devices, peak_report

    path = existing_store(store, "workers measure their devices when a fleet starts")
    records = read_store(path, all_devices)
    skipped = []
    if recalibrate:
        from fleetctl.engine.metrics.device_peaks import recalibrate_cpu

        measured = []
        for record in records:
            fresh = recalibrate_cpu(record, path) if record.how_measured.value == "calibrated" else None
            if fresh is None:
                skipped.append(record.identity)
            measured.append(fresh or record)
        records = measured
    return DevicePeaks(devices=[DevicePeak.model_validate(peak_report(record)) for record in records],
                       not_recalibrated=skipped)


def render_devices(peaks: DevicePeaks) -> str:
    """The peaks as a table (TFLOP/s, GB/s, how and when measured), and what `--recalibrate` left as it was."""
    lines = [] if peaks.devices else ["no device measured yet: workers measure their device when a fleet starts"]
    lines.append(f"{'identity':<44} {'dtype':<9} {'TFLOP/s':>8} {'GB/s':>8} {'how':<11} measured")
    for peak in peaks.devices:
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(peak.measured_at))
        lines.append(f"{peak.identity:<44} {peak.dtype:<9} {peak.peak_flops / 1e12:>8.3f} "
                     f"{peak.peak_bytes_per_s / 1e9:>8.1f} {peak.how:<11} {when}")
    lines += [f"not recalibrated: {identity} (a spec-table value, or another machine's device)"
              for identity in peaks.not_recalibrated]
    if peaks.workers:
        lines.append(f"{'worker':<12} {'role':<8} {'device':<8} {'weights':<12} {'KV':<9} {'KV tokens':>10} "
                     "device name")
        lines += [f"{w.id:<12} {w.role:<8} {w.device:<8} {w.weights or 'starting':<12} {w.kv_dtype or '-':<9} "
                  f"{w.kv_tokens:>10,} {w.device_name or '-'}" for w in peaks.workers]
    return "\n".join(lines)
