"""`fleetctl devices`: the device peaks behind every MFU and MBU (spec table or calibration, and when),
and `--recalibrate` to measure this machine's CPUs again on a quiet machine."""

import json
import time

import typer

from fleetctl.console.cli.common import JSON_OPTION, STORE_OPTION, fail, store_path


def devices(
    recalibrate: bool = typer.Option(False, "--recalibrate",
                                     help="Measure this machine's cached CPU peaks again (takes ~1 s each)."),
    store: str = STORE_OPTION,
    as_json: bool = JSON_OPTION,
) -> None:
    """Peak FLOP/s and bytes/s per device identity and dtype: the MFU and MBU denominators."""
    from fleetctl.store.db import open_db
    from fleetctl.store.devices import all_devices

    path = store_path(store)
    if not path.exists():
        raise fail(f"no metrics store at {path} (workers measure their devices when a fleet starts)")
    db = open_db(path)
    try:
        records = all_devices(db)
    finally:
        db.close()
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
    rows = [{"identity": r.identity, "dtype": r.dtype, "kind": r.kind.value, "name": r.name,
             "peak_flops": r.peak_flops, "peak_bytes_per_s": r.peak_bytes_per_s, "how": r.how_measured.value,
             "measured_at": r.measured_at} for r in records]
    if as_json:
        print(json.dumps({"devices": rows, "not_recalibrated": skipped}))
        return
    if not rows:
        print("no device measured yet: workers measure their device when a fleet starts")
    print(f"{'identity':<44} {'dtype':<9} {'TFLOP/s':>8} {'GB/s':>8} {'how':<11} measured")
    for row in rows:
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(row["measured_at"]))
        print(f"{row['identity']:<44} {row['dtype']:<9} {row['peak_flops'] / 1e12:>8.3f} "
              f"{row['peak_bytes_per_s'] / 1e9:>8.1f} {row['how']:<11} {when}")
    for identity in skipped:
        print(f"not recalibrated: {identity} (a spec-table value, or another machine's device)")
