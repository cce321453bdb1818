"""The device-peak cache: one row per device identity and dtype, so that a device is calibrated
once and every later worker on it starts instantly. Written directly (not through the batched
writer): the next lookup, possibly from another process, must find it."""

from sqlite_utils import Database

from fleetctl.domain import DeviceKind, PeakSource
from fleetctl.store.records import DeviceRecord, columns
from fleetctl.store.validate import problem

_COLUMNS = columns(DeviceRecord)


def cached_device(db: Database, identity: str, dtype: str) -> DeviceRecord | None:
    row = db.execute(
        f"SELECT {', '.join(_COLUMNS)} FROM devices WHERE identity = ? AND dtype = ?", [identity, dtype]
    ).fetchone()
    return None if row is None else _record(row)


def all_devices(db: Database) -> list[DeviceRecord]:
    """Every cached peak, by identity then dtype."""
    return [_record(row) for row in db.execute(f"SELECT {', '.join(_COLUMNS)} FROM devices ORDER BY identity, dtype")]


def _record(row: tuple) -> DeviceRecord:
    values = dict(zip(_COLUMNS, row, strict=True))
    values["kind"] = DeviceKind(values["kind"])
    values["how_measured"] = PeakSource(values["how_measured"])
    return DeviceRecord(**values)


def save_device(db: Database, record: DeviceRecord) -> None:
    reason = problem(record)
    if reason is not None:
        raise ValueError(f"device record for {record.identity}: {reason}")
    db["devices"].insert({name: getattr(record, name) for name in _COLUMNS}, replace=True)


def peak_report(record: DeviceRecord) -> dict[str, object]:
    """A cached peak as `devices --json` and `/fleet/devices` report it (the contract's `DevicePeak`)."""
    return {"identity": record.identity, "dtype": record.dtype, "kind": record.kind.value, "name": record.name,
            "peak_flops": record.peak_flops, "peak_bytes_per_s": record.peak_bytes_per_s,
            "how": record.how_measured.value, "measured_at": record.measured_at}
