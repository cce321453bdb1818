"""`fleetctl console --web`: the same console in a browser for lab demos, through textual-serve. Each
browser tab runs its own console process attached to the fleet; read-only unless an admin token is
given (a web page is easier to share than a terminal)."""

import os
import shlex
import sys

from textual_serve.server import Server


def serve_web(url: str, *, port: int, token: str | None, readonly: bool, host: str = "127.0.0.1") -> None:
    """Serve the console of the fleet at `url` until interrupted."""

    command = [sys.executable, "-m", "fleetctl.console", "console", "--url", url]
    if token:
        os.environ["FLEET_ADMIN_TOKEN"] = token  # the console processes inherit it, it stays off the command line
    if readonly or not token:
        command.append("--readonly")
    mode = "read-only" if "--readonly" in command else "admin"
    print(f"fleetctl: console for {url} on http://{host}:{port} ({mode})", flush=True)
    Server(shlex.join(command), host=host, port=port, title="fleetctl").serve()
