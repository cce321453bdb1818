"""Stopping `fleetctl console --web` ends the console process it started for each browser session (a
websocket on /ws opens one, as a browser tab does) within 4 s: none is left reparented to init."""

import asyncio
import signal
import socket
import subprocess
import threading
import time

import aiohttp
import pytest
from support.fleet_harness import free_port, wait_until
from support.quitting import process_tree, seconds_until_all_gone

from fleetctl.console.loadgen.local_fleet import FLEETCTL

pytestmark = pytest.mark.fleet
SESSIONS = 2
SESSIONS_GONE_S = 4.0


async def browser_sessions(port: int, count: int) -> None:
    """`count` browser tabs, each reading what its console sends until the server closes it."""
    async with aiohttp.ClientSession() as client:
        async def tab() -> None:
            async with client.ws_connect(f"http://127.0.0.1:{port}/ws?width=120&height=40") as websocket:
                async for _ in websocket:
                    pass

        await asyncio.gather(*(tab() for _ in range(count)), return_exceptions=True)


def session_consoles(web: subprocess.Popen) -> list[str]:
    return [" ".join(p.cmdline()) for p in process_tree(web.pid)[1:] if "console" in p.cmdline()]


def test_stopping_the_web_console_ends_every_sessions_console() -> None:
    port = free_port()
    gone_fleet = f"http://127.0.0.1:{free_port()}"  # the consoles poll a fleet that is not there
    web = subprocess.Popen([*FLEETCTL, "console", "--web", "--url", gone_fleet, "--port", str(port)],
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        assert wait_until(lambda: socket.socket().connect_ex(("127.0.0.1", port)) == 0, 30)
        tabs = threading.Thread(target=asyncio.run, args=(browser_sessions(port, SESSIONS),), daemon=True)
        tabs.start()
        assert wait_until(lambda: len(session_consoles(web)) == SESSIONS, 60), session_consoles(web)
        sessions = process_tree(web.pid)[1:]  # each a shell and the console it runs
        signalled = time.monotonic()
        web.send_signal(signal.SIGTERM)
        took = seconds_until_all_gone(sessions, signalled, timeout=30, poll=web.poll)
    finally:
        if web.poll() is None:
            web.kill()
        web.wait(10)
    assert took <= SESSIONS_GONE_S, f"{took:.1f} s"
