"""`fleetctl checkpoint`, `restore`, `migrate`, `move` and the pool changes `start`, `drain`, `resume`, `stop`:
start a fleet operation, follow it to the end (a status line on a TTY), print its result (`schemas.describe`'s
sentence, or its model's JSON). And `fleetctl checkpoints`, the list a restore picks from."""

import json
from typing import TYPE_CHECKING

import typer

from fleetctl.console.cli.common import (
    JSON_OPTION,
    TIMEOUT_OPTION,
    URL_OPTION,
    follow_operation,
    operation_output,
)
from fleetctl.console.client import FleetClient
from fleetctl.domain import WorkerRole
from fleetctl.engine.fleet.fleet_config import Supervision

if TYPE_CHECKING:
    from fleetctl.engine.api.operations import OperationInfo


def _started(path: str, body: dict[str, object], url: str | None, timeout: float) -> "OperationInfo":
    """Start the operation at `path` and follow it to its end (or `timeout`)."""
    client = FleetClient(url, timeout=30.0)
    return follow_operation(client, client.start(path, body), timeout)


def _run(path: str, body: dict[str, object], url: str | None, as_json: bool, timeout: float) -> None:
    print(operation_output(_started(path, body, url, timeout), as_json, timeout))


def checkpoint(
    worker: str = typer.Argument(..., help="Worker id, e.g. decode-0."),
    hold: float | None = typer.Option(None, "--hold", help="Seconds its sessions wait for a restore before they "
                                                           "are recomputed on peers (default: the fleet's, "
                                                           f"{Supervision.hold_s:g} s)."),
    url: str = URL_OPTION,
    as_json: bool = JSON_OPTION,
    timeout: float = TIMEOUT_OPTION,
) -> None:
    """Stand a worker down with its complete state saved; its sessions pause (their streams stay open) until
    `restore`, or are recomputed on peers after `--hold` seconds."""
    from fleetctl.engine.api.operation_results import CheckpointResult

    op = _started(f"/fleet/workers/{worker}/checkpoint", {} if hold is None else {"hold_s": hold}, url, timeout)
    output = operation_output(op, as_json, timeout)
    if not as_json and isinstance(op.result, CheckpointResult):  # the path on a line of its own first (DESIGN §2)
        output = f"{op.result.path}\n{output}"
    print(output)


def restore(
    checkpoint_path: str = typer.Argument(..., metavar="CHECKPOINT", help="Checkpoint name or path."),
    device: str = typer.Option(..., "--device", help="cpu:N or cuda:N."),
    force: bool = typer.Option(False, "--force", help="Replay its sessions even where that is refused (a "
                                                      "checkpoint restored before, or one whose sessions went on "
                                                      "elsewhere or ended): into a fresh fleet, deliberately."),
    url: str = URL_OPTION,
    as_json: bool = JSON_OPTION,
    timeout: float = TIMEOUT_OPTION,
) -> None:
    """Bring a checkpointed worker back on DEVICE (same role)."""
    _run("/fleet/restore", {"checkpoint": checkpoint_path, "device": device, "force": force}, url, as_json, timeout)


def checkpoints(url: str = URL_OPTION, as_json: bool = JSON_OPTION) -> None:
    """The checkpoints a restore can pick from, oldest first, each verified; `used` says when it was restored."""
    listed = FleetClient(url, timeout=120.0).checkpoints()
    if as_json:
        print(json.dumps(listed.model_dump(mode="json")))
        return
    print(f"{'checkpoint':<44} {'worker':<10} {'role':<8} {'sessions':>8} {'bytes':>12} {'created':<21} used")
    for row in listed.checkpoints:
        if not row.valid:
            print(f"{row.name:<44} invalid: {row.error}")
            continue
        print(f"{row.name:<44} {row.worker:<10} {row.role:<8} {row.sessions:>8} {row.bytes:>12,} "
              f"{row.created:<21} {row.used_at or '-'}")


def migrate(
    worker: str = typer.Argument(..., help="Worker id, e.g. decode-0."),
    to: str = typer.Option(..., "--to", help="Destination device: cpu:N or cuda:N."),
    via: str = typer.Option("live", "--via", help="live (sessions moved while they decode) or checkpoint "
                                                  "(the source pauses, its state goes through disk)."),
    url: str = URL_OPTION,
    as_json: bool = JSON_OPTION,
    timeout: float = TIMEOUT_OPTION,
) -> None:
    """Move WORKER to --to: a standby there takes its sessions live (a prefill worker's by checkpoint) and
    its id; the source keeps serving on failure."""
    _run(f"/fleet/workers/{worker}/migrate", {"to": to, "via": via}, url, as_json, timeout)


def move(
    session: str = typer.Argument(..., help="Request id of a decoding session (`fleetctl workers`, X-Request-Id)."),
    to: str = typer.Option(..., "--to", help="A running worker of the session's role, e.g. decode-1."),
    url: str = URL_OPTION,
    as_json: bool = JSON_OPTION,
    timeout: float = TIMEOUT_OPTION,
) -> None:
    """Move SESSION live to worker --to: its KV is copied while it decodes, then it stops for one step."""
    _run(f"/fleet/requests/{session}/move", {"to": to}, url, as_json, timeout)


def start(
    role: WorkerRole = typer.Option(..., "--role", help="prefill, decode, or mixed (both phases; in any fleet)."),
    device: str = typer.Option(..., "--device", help="A free device: cpu:N or cuda:N."),
    url: str = URL_OPTION,
    as_json: bool = JSON_OPTION,
    timeout: float = TIMEOUT_OPTION,
) -> None:
    """Start a worker of ROLE on DEVICE (the next free id, e.g. decode-2); it takes traffic once loaded."""
    _run("/fleet/workers", {"role": role.value, "device": device}, url, as_json, timeout)


def drain(
    worker: str = typer.Argument(..., help="Worker id, e.g. decode-0."),
    move: bool = typer.Option(False, "--move", help="Move its decoding sessions to peers live instead of "
                                                    "waiting for them to finish."),
    url: str = URL_OPTION,
    as_json: bool = JSON_OPTION,
    timeout: float = TIMEOUT_OPTION,
) -> None:
    """Route WORKER nothing new and wait until its sessions have finished (or moved); it keeps running, drained."""
    _run(f"/fleet/workers/{worker}/drain", {"move": move}, url, as_json, timeout)


def resume(
    worker: str = typer.Argument(..., help="Worker id, e.g. decode-0."),
    url: str = URL_OPTION,
    as_json: bool = JSON_OPTION,
    timeout: float = TIMEOUT_OPTION,
) -> None:
    """Let a drained (or draining) WORKER take new work again; calls off a drain in progress."""
    _run(f"/fleet/workers/{worker}/resume", {}, url, as_json, timeout)


def switch(
    worker: str = typer.Argument(..., help="Worker id, e.g. decode-1."),
    role: WorkerRole = typer.Option(..., "--role", help="The role it serves from now on: prefill, decode or "
                                                        "mixed (both phases)."),
    url: str = URL_OPTION,
    as_json: bool = JSON_OPTION,
    timeout: float = TIMEOUT_OPTION,
) -> None:
    """Change WORKER's role in place: its sessions move live to peers (or finish), then the same process serves
    ROLE under the next id of that role, its weights and prefix cache kept."""
    _run(f"/fleet/workers/{worker}/switch", {"role": role.value}, url, as_json, timeout)


def stop(
    worker: str = typer.Argument(..., help="Worker id, e.g. decode-0."),
    force: bool = typer.Option(False, "--force", help="Do not wait: recompute its sessions on peers now."),
    url: str = URL_OPTION,
    as_json: bool = JSON_OPTION,
    timeout: float = TIMEOUT_OPTION,
) -> None:
    """Drain WORKER, then shut its process down (with --force, move its sessions to peers at once)."""
    _run(f"/fleet/workers/{worker}/stop", {"force": force}, url, as_json, timeout)
