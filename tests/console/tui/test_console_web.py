"""The console in a real headless browser: `fleetctl console --web` against a running fleet, opened in
Debian's Chromium through playwright. The page draws on a canvas, so the test reads what the console
sends it over the websocket and finds the dashboard there."""

import shutil
import socket
import subprocess
import time
from pathlib import Path

import pytest
from support.fleet_harness import serve

from fleetctl.console.loadgen.local_fleet import FLEETCTL

CHROMIUM = shutil.which("chromium")
pytestmark = [pytest.mark.fleet, pytest.mark.skipif(CHROMIUM is None, reason="Debian's chromium is not installed")]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_the_web_console_shows_the_dashboard(tiny_model_dir: Path) -> None:
    playwright = pytest.importorskip("playwright.sync_api")
    with serve(tiny_model_dir, "--prefill", "1", "--decode", "1", "--devices", "cpu:0,cpu:1") as url:
        port = free_port()
        web = subprocess.Popen([*FLEETCTL, "console", "--web", "--url", url, "--port", str(port)],
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        try:
            deadline = time.monotonic() + 30
            while socket.socket().connect_ex(("127.0.0.1", port)) != 0:
                assert time.monotonic() < deadline and web.poll() is None, web.stdout.read() if web.stdout else ""
                time.sleep(0.2)
            received = bytearray()
            with playwright.sync_playwright() as p:
                browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox", "--disable-gpu"])
                page = browser.new_page(viewport={"width": 1400, "height": 900})
                page.on("websocket", lambda ws: ws.on("framereceived", lambda frame: received.extend(
                    frame if isinstance(frame, bytes) else frame.encode())))
                page.goto(f"http://127.0.0.1:{port}")
                deadline = time.monotonic() + 60
                while not (b"workers" in received and b"prefill-0" in received and b"read-only" in received):
                    assert time.monotonic() < deadline, bytes(received[-400:])
                    page.wait_for_timeout(250)
                browser.close()
        finally:
            web.terminate()
            web.wait(10)
