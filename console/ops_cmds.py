"""`fleetctl checkpoint`, `restore`, `migrate`: start a fleet operation, follow it to the end (a
progress display on a TTY), print its result."""

import json
import sys
import time

import typer

from fleetctl.console.client import FleetClient, FleetClientError
from fleetctl.console.errors import fail

URL_OPTION = typer.Option(None, "--url", help="Fleet URL (default $FLEET_URL or http://127.0.0.1:8700).")
JSON_OPTION = typer.Option(False, "--json", help="One JSON object on stdout.")


def _follow(client: FleetClient, op: dict, timeout: float) -> dict:
    """Poll /fleet/operations/{id} until it ends; returns its final state."""
    deadline = time.monotonic() + timeout
    if sys.stderr.isatty():
        from rich.console import Console

        with Console(stderr=True).status(f"{op['kind']} {op['worker']}: {op['stage']}") as status:
            while op["state"] == "running" and time.monotonic() < deadline:
                time.sleep(0.1)
                op = client.get(f"/fleet/operations/{op['id']}")
                status.update(f"{op['kind']} {op['worker']}: {op['stage']}")
        return op
    while op["state"] == "running" and time.monotonic() < deadline:
        time.sleep(0.1)
        op = client.get(f"/fleet/operations/{op['id']}")
    return op


def _run(path: str, body: dict, url: str | None, as_json: bool, timeout: float) -> None:
    try:
        client = FleetClient(url, timeout=30.0)
        op = _follow(client, client.post(path, body), timeout)
    except FleetClientError as exc:
        raise fail(str(exc)) from None
    if op["state"] == "running":
        raise fail(f"{op['kind']} of {op['worker']} still running after {timeout:.0f}s (operation {op['id']})")
    if op["state"] == "failed":
        raise fail(f"{op['kind']} of {op['worker']} failed: {op['error']}")
    result = op["result"]
    if as_json:
        print(json.dumps(result))
        return
    if op["kind"] == "checkpoint":
        print(f"{result['path']}\n{result['worker']}: {result['sessions']} session(s), {result['bytes']} bytes, "
              f"{result['seconds']:.3f} s")
        return
    mode = result["mode"] + (f": {result['reason']}" if result["reason"] else "")
    print(f"{result['worker']} {result['from'] or '-'} -> {result['to']}: {mode}; {result['sessions']} session(s) "
          f"moved, {result['bytes']} bytes, downtime {result['downtime_s']:.3f} s")


def checkpoint(
    worker: str = typer.Argument(..., help="Worker id, e.g. decode-0."),
    hold: float = typer.Option(300.0, "--hold", help="Seconds its sessions wait for a restore before "
                                                      "they are recomputed on peers."),
    url: str = URL_OPTION,
    as_json: bool = JSON_OPTION,
    timeout: float = typer.Option(600.0, "--timeout"),
) -> None:
    """Stand a worker down with its complete state saved; its sessions pause until `restore`."""
    _run(f"/fleet/workers/{worker}/checkpoint", {"hold_s": hold}, url, as_json, timeout)


def restore(
    checkpoint_path: str = typer.Argument(..., metavar="CHECKPOINT", help="Checkpoint name or path."),
    device: str = typer.Option(..., "--device", help="cpu:N or cuda:N."),
    url: str = URL_OPTION,
    as_json: bool = JSON_OPTION,
    timeout: float = typer.Option(600.0, "--timeout"),
) -> None:
    """Bring a checkpointed worker back on DEVICE (same role)."""
    _run("/fleet/restore", {"checkpoint": checkpoint_path, "device": device}, url, as_json, timeout)


def migrate(
    worker: str = typer.Argument(..., help="Worker id, e.g. decode-0."),
    to: str = typer.Option(..., "--to", help="Destination device: cpu:N or cuda:N."),
    url: str = URL_OPTION,
    as_json: bool = JSON_OPTION,
    timeout: float = typer.Option(600.0, "--timeout"),
) -> None:
    """Checkpoint WORKER, restore it on --to, re-route its live sessions; the source resumes on failure."""
    _run(f"/fleet/workers/{worker}/migrate", {"to": to}, url, as_json, timeout)
