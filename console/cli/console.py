"""`fleetctl console` (and `fleetctl` alone on a terminal): attach the console to a fleet, or start an
embedded one on the default model and the local devices and stop it when the console quits."""

import os
from pathlib import Path
from typing import Any

import typer

from fleetctl.console.cli.common import QUANTIZATION_OPTION, fail, store_path
from fleetctl.console.cli.declared import Options, with_options
from fleetctl.console.cli.embedded import embedded_fleet
from fleetctl.console.client import DEFAULT_URL, FleetClient, FleetRefused, FleetUnreachable, fleet_url
from fleetctl.console.console_settings import ConsoleSettings
from fleetctl.domain import Quantization
from fleetctl.engine.model.registry import DEFAULT_MODEL
from fleetctl.options import field_values
from fleetctl.themes import THEME_NAMES


@with_options(Options(ConsoleSettings))
def console(
    settings_given: dict[str, Any],
    url: str = typer.Option(None, "--url", help="Fleet to attach to (default $FLEET_URL; else a fleet on "
                                                f"{DEFAULT_URL}; else an embedded one)."),
    token: str = typer.Option(None, "--token", help="Admin token (default $FLEET_ADMIN_TOKEN or the token file)."),
    store: str = typer.Option("", "--store", help="Read history from this metrics store instead of the fleet's API."),
    model: str = typer.Option(DEFAULT_MODEL, "--model", "-m", help="The embedded fleet's model."),
    quantization: Quantization = QUANTIZATION_OPTION,
    web: bool = typer.Option(False, "--web", help="Serve the console to a browser instead (textual-serve)."),
    port: int = typer.Option(8710, "--port", help="With --web: the port to serve on (127.0.0.1)."),
) -> None:
    """Open the fleet console: pools, workers, devices, traffic, events; actions from the keyboard."""
    from fleetctl.console.tui.settings import load_settings  # the console's, only when it is used

    given = {name: value for name, value in field_values(ConsoleSettings, settings_given).items() if value}
    settings = load_settings(**given)  # the command line's settings over the config file's
    if (theme := given.get("theme")) and theme not in THEME_NAMES:
        raise fail(f"unknown theme {theme!r}: choose {' or '.join(THEME_NAMES)}")
    target = url or os.environ.get("FLEET_URL") or (DEFAULT_URL if answers(DEFAULT_URL) else None)
    if web:
        if target is None:
            raise fail("--web needs a running fleet: start one with `fleetctl serve` (or pass --url)")
        from fleetctl.console.tui.web import serve_web

        serve_web(target, port=port, token=token, readonly=settings.readonly)
        return
    attach(target, token=token, store=Path(store).expanduser() if store else None, settings=settings, model=model,
           quantization=quantization)


def attach(url: str | None, *, token: str | None, store: Path | None, settings: ConsoleSettings,
           model: str, quantization: Quantization = Quantization.NONE) -> None:
    from fleetctl.console.tui.app import run_console
    from fleetctl.engine.metrics.gpu_sampler import GpuSampler
    from fleetctl.store.db import open_db

    if url is not None:
        if store is not None:
            open_db(store).close()  # a store that cannot be read is one line here, not an error inside the console
        run_console(fleet_url(url), store=store, token=token, settings=settings, gpus=GpuSampler())
        return
    fleet_store = store or store_path("")
    print(f"fleetctl: no fleet answers at {DEFAULT_URL}: starting an embedded one ({model}) …", flush=True)
    with embedded_fleet(model, fleet_store, quantization) as embedded:
        run_console(embedded, embedded=True, store=fleet_store, token=token, settings=settings, gpus=GpuSampler())


def answers(url: str) -> bool:
    """Whether a fleet answers at `url`: healthy, or starting (503)."""
    try:
        FleetClient(url, timeout=0.5).get("/health")
    except FleetUnreachable:
        return False
    except FleetRefused as exc:
        return exc.status == 503
    return True
