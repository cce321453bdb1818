"""`fleetctl console --web`: the same console in a browser for lab demos, through textual-serve. Each
browser tab runs its own console process attached to the fleet; read-only unless an admin token is
given (a web page is easier to share than a terminal). When the server stops, so does every tab's console
(textual-serve leaves them running, reparented to init)."""

import contextlib
import os
import shlex
import sys

import psutil
from textual_serve.server import Server

SESSION_EXIT_S = 2.0  # a session's console (SIGTERM: it quits as on `q`) still running after this is killed


def serve_web(url: str, *, port: int, token: str | None, readonly: bool, host: str = "127.0.0.1") -> None:
    """Serve the console of the fleet at `url` until interrupted."""

    command = [sys.executable, "-m", "fleetctl.console", "console", "--url", url]
    if token:
        os.environ["FLEET_ADMIN_TOKEN"] = token  # the console processes inherit it, it stays off the command line
    if readonly or not token:
        command.append("--readonly")
    mode = "read-only" if "--readonly" in command else "admin"
    print(f"fleetctl: console for {url} on http://{host}:{port} ({mode})", flush=True)
    ConsoleServer(shlex.join(command), host=host, port=port, title="fleetctl").serve()


class ConsoleServer(Server):
    def request_exit(self) -> None:
        """On SIGTERM/SIGINT: the sessions' consoles first (their websockets then close at once; the server
        would otherwise wait for them), then the server."""
        end_sessions()
        super().request_exit()


def end_sessions() -> None:
    """End the session processes this server started (each a shell and the console it runs)."""
    sessions = psutil.Process().children(recursive=True)
    for process in sessions:
        with contextlib.suppress(psutil.NoSuchProcess):
            process.terminate()
    _, lingering = psutil.wait_procs(sessions, timeout=SESSION_EXIT_S)
    for process in lingering:
        with contextlib.suppress(psutil.NoSuchProcess):
            process.kill()
    psutil.wait_procs(lingering, timeout=1.0)
