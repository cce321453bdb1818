"""Checks a record before it is queued: numbers of the declared type, finite and non-negative,
fractions within 0..1, enum columns holding one of their values. Returns the first problem found,
or None when the record may be written."""

import math
import types
from dataclasses import dataclass, fields
from enum import StrEnum

from fleetctl.store.records import RECORD_TYPES, DeviceRecord, GpuSample, Record, WorkerSample

_FRACTIONS: dict[type, tuple[str, ...]] = {
    WorkerSample: ("busy", "kv_usage"),
    GpuSample: ("sm_util", "mem_util"),
}
_POSITIVE: dict[type, tuple[str, ...]] = {
    WorkerSample: ("interval_s",),
    GpuSample: ("interval_s",),
    DeviceRecord: ("peak_flops", "peak_bytes_per_s"),
}
_FRACTION_SLACK = 1e-6  # float rounding in a busy / interval division


@dataclass(frozen=True)
class _Number:
    name: str
    accepted: type | types.UnionType  # int columns take only ints: their sums must stay exact
    optional: bool


def _field_kinds(record_type: type) -> tuple[tuple[_Number, ...], tuple[tuple[str, frozenset[str]], ...]]:
    numbers: list[_Number] = []
    enums: list[tuple[str, frozenset[str]]] = []
    for f in fields(record_type):
        kind, optional = f.type, False
        if isinstance(kind, types.UnionType):  # `float | None`
            kind, optional = next(arg for arg in kind.__args__ if arg is not type(None)), True
        if kind is int:
            numbers.append(_Number(f.name, int, optional))
        elif kind is float:
            numbers.append(_Number(f.name, int | float, optional))
        elif isinstance(kind, type) and issubclass(kind, StrEnum):
            enums.append((f.name, frozenset(member.value for member in kind)))
    return tuple(numbers), tuple(enums)


_KINDS = {t: _field_kinds(t) for t in RECORD_TYPES}


def problem(record: Record) -> str | None:
    numbers, enums = _KINDS[type(record)]
    for number in numbers:
        value = getattr(record, number.name)
        if value is None and number.optional:
            continue
        if isinstance(value, bool) or not isinstance(value, number.accepted):
            return f"{number.name}={value!r} is not {'an int' if number.accepted is int else 'a number'}"
        if not math.isfinite(value) or value < 0:
            return f"{number.name}={value!r} must be finite and non-negative"
    for name in _POSITIVE.get(type(record), ()):
        if getattr(record, name) == 0:
            return f"{name} must be positive"
    for name in _FRACTIONS.get(type(record), ()):
        if getattr(record, name) > 1 + _FRACTION_SLACK:
            return f"{name}={getattr(record, name)!r} is a fraction above 1"
    for name, values in enums:
        value = getattr(record, name)
        if not isinstance(value, str) or value not in values:
            return f"{name}={value!r} is not one of {', '.join(sorted(values))}"
    return None
