"""The checkpoints an operator can restore: where a name may point, what `/fleet/checkpoints` lists (each
verified, with when it was restored), and when a restore would replay sessions instead of continuing
them — refused unless forced.

Reading and hashing checkpoints is slow for large ones: callers run `catalog` and `read_checkpoint` in a
thread, never on the event loop."""

from pathlib import Path

from fleetctl.domain import WorkerState
from fleetctl.engine.checkpoint.format import (
    CheckpointError,
    SavedCheckpoint,
    list_checkpoints,
    read_checkpoint,
    used_at,
)
from fleetctl.engine.fleet.errors import OperationRefused
from fleetctl.engine.fleet.state import FleetState
from fleetctl.engine.paths import checkpoint_root

FORCE_HINT = "restore --force replays it deliberately (into a fresh fleet)"


def resolve_checkpoint(given: str) -> Path:
    """A checkpoint name or path, which must lie inside $FLEET_HOME/checkpoints."""
    root = checkpoint_root().resolve()
    if not given or not given.isprintable():
        raise OperationRefused(400, f"checkpoint {given!r} is not a name or a path")
    if ".." in Path(given).parts:
        raise OperationRefused(400, f"checkpoint path {given!r} may not contain '..'")
    try:
        path = (Path(given) if Path(given).is_absolute() else root / given).resolve()
        found = path.is_dir()
    except (OSError, ValueError) as exc:  # a name too long for the file system, say
        raise OperationRefused(400, f"checkpoint {given!r}: {exc}") from None
    if root not in path.parents:
        raise OperationRefused(400, f"checkpoint {given!r} is outside {root}")
    if not found:
        raise OperationRefused(404, f"no checkpoint {given!r} in {root}")
    return path


def catalog() -> list[dict]:
    """Every finished checkpoint, oldest first, verified; `used_at` says when it was restored."""
    rows = []
    for path in list_checkpoints(checkpoint_root()):
        row = {"checkpoint": str(path), "name": path.name, "used_at": used_at(path)}
        try:
            saved = read_checkpoint(path)
        except CheckpointError as exc:
            rows.append(row | {"valid": False, "error": str(exc)})
            continue
        rows.append(row | {"valid": True, "worker": saved.worker_id, "role": saved.role.value,
                           "sessions": len(saved.sessions), "created": saved.manifest.created,
                           "bytes": sum(f.stat().st_size for f in path.iterdir())})
    return rows


def replay_refusal(saved: SavedCheckpoint, used: str | None, stood_down_with: Path | None,
                   state: FleetState) -> str | None:
    """Why restoring `saved` would replay sessions rather than continue them (None: it would not).

    A restore continues the sessions a worker of this fleet was stood down with, from the checkpoint it
    stood down with (`stood_down_with`). Anything else replays: a checkpoint restored before (`used`), an
    older checkpoint of a worker, sessions that went on elsewhere (the hold expired), or sessions this
    fleet does not have in flight at all (they ended, or the checkpoint is another fleet's)."""
    name = saved.path.name
    if used:
        return f"{name} was restored already ({used}); restoring it again would replay its sessions"
    view = state.views.get(saved.worker_id)
    if view is not None and view.state is WorkerState.CHECKPOINTED:
        if stood_down_with is not None and stood_down_with != saved.path:
            return (f"{name} is older than the checkpoint {saved.worker_id} stood down with "
                    f"({stood_down_with.name}): its sessions have progressed since; restore that one")
        return None
    known = [state.requests[s.request_id] for s in saved.sessions if s.request_id in state.requests]
    if known:
        req = known[0]
        where = f" on {req.holder()}" if req.holder() else ""
        return (f"session {req.request_id} has progressed since {name} was written (it runs{where} now): "
                f"restoring it would replay it")
    if saved.sessions:
        return (f"none of the {len(saved.sessions)} session(s) in {name} is in flight in this fleet (they "
                f"ended, or the checkpoint is another fleet's): restoring would replay them")
    return None
