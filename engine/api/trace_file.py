"""Request traces in the Mooncake format (FAST '25 release): JSON Lines, one request per line,
`{"timestamp": <ms since the trace began>, "input_length": <tokens>, "output_length": <tokens>,
"hash_ids": [<id of each 512-token block of the prompt>, …]}`. Requests sharing a hash id share that
block of prompt (a cached prefix). Blank lines are skipped; extra fields are ignored."""

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from fleetctl.errors import UserError

MOONCAKE_BLOCK_TOKENS = 512


@dataclass(frozen=True)
class TraceRecord:
    arrival_s: float  # since the trace's first request
    input_length: int
    output_length: int
    hash_ids: tuple[int, ...]


def _field(obj: dict, name: str, where: str) -> int:
    value = obj.get(name)
    if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
        raise UserError(f"{where}: {name!r} must be a number >= 0, got {value!r}")
    return value


def json_lines(path: Path) -> Iterator[tuple[str, dict]]:
    """Each non-blank line of a JSONL trace as (`path:line` for errors, its object); UserError for a file
    that cannot be read or a line that is not a JSON object."""
    try:
        lines = path.read_text().splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise UserError(f"cannot read trace {path}: {exc}") from None
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        where = f"{path}:{number}"
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as exc:
            raise UserError(f"{where}: not JSON ({exc.msg})") from None
        if not isinstance(obj, dict):
            raise UserError(f"{where}: expected a JSON object per line")
        yield where, obj


def read_mooncake(path: Path | str) -> list[TraceRecord]:
    """The trace's requests in arrival order."""
    path = Path(path)
    raw = []
    for where, obj in json_lines(path):
        hash_ids = obj.get("hash_ids", [])
        if not isinstance(hash_ids, list) or not all(isinstance(h, int) for h in hash_ids):
            raise UserError(f"{where}: 'hash_ids' must be a list of integers")
        length, output = int(_field(obj, "input_length", where)), int(_field(obj, "output_length", where))
        if length < 1 or output < 1:
            raise UserError(f"{where}: input_length and output_length must be >= 1")
        raw.append((float(_field(obj, "timestamp", where)), length, output, tuple(hash_ids)))
    if not raw:
        raise UserError(f"trace {path} holds no requests")
    raw.sort(key=lambda r: r[0])
    first = raw[0][0]
    return [TraceRecord((ts - first) / 1000, length, output, hashes) for ts, length, output, hashes in raw]
