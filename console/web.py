"""`fleetctl console --web`: the same console in a browser for lab demos, through textual-serve. Each
browser tab runs its own console process attached to the fleet; read-only unless an admin token is
given (a web page is easier to share than a terminal)."""

import os
import shlex
import sys

from fleetctl.console.errors import fail


def serve_web(url: str | None, *, port: int, token: str | None, readonly: bool, host: str = "127.0.0.1") -> None:
    """Serve until interrupted. Without a fleet URL there is nothing to attach to: say so."""
    if url is None:
        raise fail("--web needs a running fleet: start one with `fleetctl serve` (or pass --url)")
    from textual_serve.server import Server

    command = [sys.executable, "-m", "fleetctl.console", "console", "--url", url]
    if token:
        os.environ["FLEET_ADMIN_TOKEN"] = token  # the console processes inherit it, it stays off the command line
    if readonly or not token:
        command.append("--readonly")
    mode = "read-only" if "--readonly" in command else "admin"
    print(f"fleetctl: console for {url} on http://{host}:{port} ({mode})", flush=True)
    Server(shlex.join(command), host=host, port=port, title="fleetctl").serve()
