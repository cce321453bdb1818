"""What every command shares: the common options, where the metrics store is, `fail` (a command's own one-line
error), and progress on a terminal: a bar per stage of a long step, a status line while a fleet operation runs to
its end, and what an operation prints when it ends (`operation_output`)."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

import typer

from fleetctl.console.cli.declared import shared_option
from fleetctl.console.client import FleetClient
from fleetctl.engine.core.engine_settings import EngineSettings
from fleetctl.engine.paths import store_file
from fleetctl.errors import FleetctlError

if TYPE_CHECKING:
    from fleetctl.engine.api.operations import OperationInfo

EXIT_INTERRUPTED = 130

URL_OPTION = typer.Option(None, "--url", help="Fleet URL (default $FLEET_URL or http://127.0.0.1:8700).")
JSON_OPTION = typer.Option(False, "--json", help="One JSON object on stdout.")
TIMEOUT_OPTION = typer.Option(600.0, "--timeout", help="Seconds to follow the operation before giving up on it.")
QUANTIZATION_OPTION = shared_option(EngineSettings, "quantization")  # of `console` and `demo`'s embedded fleet

# `plan`, `classify` and `devices`: the store's reports, read from a store file or asked of a fleet (`fleet_to_ask`)
REPORT_STORE_OPTION = typer.Option("", "--store", help="Read this SQLite metrics store file, even where $FLEET_URL "
                                                       "is set.")
REPORT_URL_OPTION = typer.Option(None, "--url", help="Ask this fleet, which reads its own store (default $FLEET_URL; "
                                                     "with neither --url nor $FLEET_URL: read $FLEET_HOME/fleet.db).")

ProgressCallback = Callable[[str, int, int], None]  # (stage, done, total)


def store_path(option: str) -> Path:
    """--store, else the default store under $FLEET_HOME."""
    return store_file(option)


def existing_store(option: str, hint: str) -> Path:
    """`store_path(option)`, or `fail(...)` saying where no store was found and `hint`."""
    path = store_path(option)
    if not path.exists():
        raise fail(f"no metrics store at {path} ({hint})")
    return path


def fleet_to_ask(store: str, url: str | None) -> str | None:
    """Where a store report reads: None for a store file (--store given, or neither --url nor $FLEET_URL: the
    default store), else the URL of the fleet to ask. --store and --url together are refused."""
    if store and url:
        raise fail("--store reads a store file and --url asks a fleet: give one of them")
    if store:
        return None
    return url or os.environ.get("FLEET_URL") or None


def fail(message: str) -> FleetctlError:
    """What a command raises to end in one `fleetctl: error:` line and exit 1 (`Commands` in app.py says it)."""
    return FleetctlError(message)


def follow_operation(client: FleetClient, op: OperationInfo, timeout: float) -> OperationInfo:
    """Poll /fleet/operations/{id} until it ends or `timeout` passes (a status line on a terminal); returns its
    last state."""
    if sys.stderr.isatty():
        from rich.console import Console

        with Console(stderr=True).status(f"{op.kind} {op.worker}: {op.stage}") as status:
            return client.follow(op, timeout, lambda now: status.update(f"{now.kind} {now.worker}: {now.stage}"))
    return client.follow(op, timeout)


def operation_output(op: OperationInfo, as_json: bool, timeout: float) -> str:
    """What a followed operation prints: its result's JSON (`--json`) or the one sentence `schemas.describe` says
    of it (the console's dialog says the same); `fail(...)` with that sentence when it failed or was called off,
    or with its id when it still runs after `timeout`."""
    from fleetctl.engine.api.operations import describe

    if op.state == "running":
        raise fail(f"{op.kind} of {op.worker} still running after {timeout:.0f}s (operation {op.id})")
    if op.state != "done" or op.result is None:  # failed, or cancelled by a later operation
        raise fail(describe(op))
    return json.dumps(op.result.model_dump(mode="json")) if as_json else describe(op)


@contextmanager
def stage_progress(description: str) -> Iterator[ProgressCallback | None]:
    """Yields a `(stage, done, total)` callback driving one rich bar per stage, or None off a terminal."""
    if not sys.stderr.isatty():
        yield None
        return
    from rich.console import Console
    from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn

    with Progress(
        TextColumn(f"{description} [bold]{{task.description}}"),
        BarColumn(),
        TextColumn("{task.completed}/{task.total}"),
        TimeRemainingColumn(),
        console=Console(stderr=True),
        transient=True,
    ) as progress:
        tasks: dict[str, int] = {}

        def update(stage: str, done: int, total: int) -> None:
            if stage not in tasks:
                tasks[stage] = progress.add_task(stage, total=max(total, 1))
            progress.update(tasks[stage], completed=done, total=max(total, 1))

        yield update
