"""`fleetctl serve`: a fleet and its HTTP server in the foreground. Its options are the ones the fleet's settings
(FleetConfig, with its EngineSettings, Supervision and AutoplanSettings) and the server's (ServerSettings)
declare."""

import errno
import os
import socket
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from fleetctl.console.cli.common import EXIT_INTERRUPTED, fail
from fleetctl.console.cli.declared import Options, with_options
from fleetctl.console.cli.models import resolve_model
from fleetctl.engine.fleet.fleet_config import FleetConfig
from fleetctl.engine.fleet.shutdown_budget import SERVER_CLOSE_S
from fleetctl.engine.paths import store_file
from fleetctl.engine.server.server_settings import ServerSettings
from fleetctl.options import build

if TYPE_CHECKING:
    from fleetctl.engine.fleet.controller import Fleet

# An idle keep-alive connection is closed after this long. Uvicorn's default, 5 s, is also httpx's (the openai
# client's, the demo's) idle expiry: a request sent on a pooled connection just as the server closed it was reset
# (httpx `ReadError('')`, 3 of 300 requests sent 5 s apart). Far above any client's expiry, the client always
# gives a connection up first.
KEEP_ALIVE_S = 75.0


@with_options(Options(FleetConfig, panel="Fleet"), Options(ServerSettings, panel="Server"))
def serve(options: dict[str, Any]) -> None:
    """Run a fleet and its HTTP server in the foreground (a stats line every 10 s on stderr)."""
    os.umask(0o077)  # everything the fleet writes (store, checkpoints, handoff buffers, token) is the user's alone

    from fleetctl.engine.fleet.controller import Fleet

    if options["max_workers"] and not options["autoplan"]:
        raise fail("--max-workers sets how far --autoplan may grow the fleet: give --autoplan with it")
    server = build(ServerSettings, options)
    listener = bind(server.host, server.port)  # first: a taken port fails in milliseconds, before a model is looked at
    if server.store_reset:
        reset_if_corrupt(store_file(options["store"]))
    try:
        config = build(FleetConfig, options, model_dir=resolve_model(options["model"]))
        fleet = Fleet(config, launcher=ray_launcher(server.ray) if server.ray else None)
    except BaseException:  # a bad option, a model that cannot be had, Ctrl-C: the port is free at once
        listener.close()
        raise
    run_server(fleet, server, listener)


def run_server(fleet: "Fleet", server: ServerSettings, listener: socket.socket) -> None:
    """Serve `fleet`'s HTTP API on `listener` until SIGTERM/SIGINT; a server that cannot start is one line."""
    import logging

    import uvicorn

    from fleetctl.engine.api.admin_token import load_or_create_admin_token
    from fleetctl.engine.server.app import create_app
    from fleetctl.engine.server.graceful import GracefulServer
    from fleetctl.engine.server.overload import ConnectionLimit

    token = load_or_create_admin_token()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s", stream=sys.stderr)
    app = create_app(fleet, token, bound_host=server.host, api_key=server.api_key,
                     response_ttl_s=server.response_ttl_s)
    server_config = uvicorn.Config(app, log_level="warning", access_log=server.access_log, log_config=None,
                                   timeout_graceful_shutdown=SERVER_CLOSE_S, timeout_keep_alive=KEEP_ALIVE_S)
    logging.getLogger("uvicorn.access").setLevel(logging.INFO if server.access_log else logging.WARNING)
    logging.getLogger("uvicorn.error").setLevel(logging.CRITICAL)  # failures are reported below, in one line
    uvicorn_server = GracefulServer(server_config, fleet, server.grace_s)
    if server.limit_concurrency:  # counted from uvicorn's own tally of the server's connections and requests
        server_config.app = ConnectionLimit(app, server.limit_concurrency, uvicorn_server.server_state)
    announce(uvicorn_server, fleet, server.host)
    try:
        uvicorn_server.run(sockets=[listener])
    except KeyboardInterrupt:  # the SIGINT uvicorn re-raises once the fleet has shut down: nothing went wrong
        raise typer.Exit(EXIT_INTERRUPTED) from None
    except SystemExit:  # uvicorn exits 3 when the app's startup fails: say why instead
        if not app.state.startup_error:
            raise
    if app.state.startup_error:
        raise fail(app.state.startup_error)


def reset_if_corrupt(path: Path) -> None:
    """--store-reset: a store that is not a database is moved aside (a sound one, or one with another problem, is
    left for the fleet to open or to refuse)."""
    from fleetctl.store.db import move_aside, open_db
    from fleetctl.store.errors import StoreFileError, StoreProblem

    try:
        open_db(path).close()
    except StoreFileError as exc:
        if exc.problem is not StoreProblem.NOT_A_DATABASE:
            raise
        print(f"fleetctl: the store {exc.path} was not a database: moved it aside to {move_aside(exc.path)}; "
              f"starting a fresh one", file=sys.stderr)


def ray_launcher(address: str):
    """The Ray launcher for `--ray ADDRESS` (Ray is imported only here); one clear line if it cannot be had."""
    try:
        from fleetctl.engine.worker.ray_launcher import RayLauncher
    except ImportError as exc:
        raise fail(f"--ray needs Ray installed (pip install 'fleetctl[ray]'): {exc}") from None
    try:
        return RayLauncher(address)
    except (ConnectionError, RuntimeError, ValueError) as exc:
        raise fail(f"cannot join the Ray cluster at {address}: {exc}") from None


def bind(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    listener = socket.socket(family, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        listener.bind((host, port))
    except OSError as exc:
        listener.close()
        reason = "is in use (pick another with --port, or 0 for any)" if exc.errno == errno.EADDRINUSE else exc.strerror
        raise fail(f"cannot listen on {host}:{port}: {reason}") from None
    listener.listen(2048)
    return listener


def announce(server, fleet, host: str) -> None:
    """Print the URL (with the real port) once uvicorn is listening."""
    startup = server.startup

    async def startup_and_announce(sockets=None) -> None:
        await startup(sockets)
        if server.started:
            bound = server.servers[0].sockets[0].getsockname()[1]
            fleet.url = f"http://{host}:{bound}"
            workers = ", ".join(f"{v.worker_id}@{v.device}" for v in fleet.views.values())
            print(f"fleetctl: serving {fleet.model_name} on {fleet.url} ({workers})", flush=True)

    server.startup = startup_and_announce
