"""The console in a real headless browser: `fleetctl console --web` against a running fleet, opened in
Debian's Chromium through playwright. The page draws on a canvas, so the test reads what the console
sends it over the websocket and finds the dashboard there; keys typed into the page reach the console."""

import re
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import ModuleType

import pytest
from support.fleet_harness import free_port, serve

from fleetctl.console.loadgen.local_fleet import FLEETCTL
from fleetctl.console.tui.actions import ACTIONS_BY_ID
from fleetctl.engine.api.admin_token import read_admin_token

CHROMIUM = shutil.which("chromium")
pytestmark = [pytest.mark.fleet, pytest.mark.skipif(CHROMIUM is None, reason="Debian's chromium is not installed")]
FLEET = ("--prefill", "1", "--decode", "1", "--devices", "cpu:0,cpu:1")
DRAIN_QUESTION = rb"Drain ((?:prefill|decode)-\d)\?"  # the confirm dialog of `d`
ESCAPE_SEQUENCE = re.compile(rb"\x1b\[[0-9;?]*[A-Za-z]")  # cursor moves and colours between the words


class WebConsole:
    """A browser tab on the web console, and everything the console has sent it."""

    def __init__(self, page: object) -> None:
        self.page = page
        self.received = bytearray()

    def text(self, since: int = 0) -> bytes:
        """What the console sent after byte `since`, without its escape sequences."""
        return ESCAPE_SEQUENCE.sub(b"", self.received[since:])

    def wait_for(self, *patterns: bytes, since: int = 0, timeout: float = 60) -> None:
        """Until every regex in `patterns` is in the text the console sent after byte `since`."""
        deadline = time.monotonic() + timeout
        while not all(re.search(pattern, self.text(since)) for pattern in patterns):
            assert time.monotonic() < deadline, (patterns, self.text(since)[-600:])
            self.page.wait_for_timeout(250)

    def press(self, key: str, *expected: bytes) -> None:
        """Type `key` into the page and wait for the console to answer with `expected`."""
        since = len(self.received)
        self.page.keyboard.press(key)
        self.wait_for(*expected, since=since)


@contextmanager
def web_console(playwright: ModuleType, url: str, *options: str) -> Iterator[WebConsole]:
    """`fleetctl console --web --url url *options` opened in Chromium, its dashboard drawn."""
    port = free_port()
    web = subprocess.Popen([*FLEETCTL, "console", "--web", "--url", url, "--port", str(port), *options],
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 30
        while socket.socket().connect_ex(("127.0.0.1", port)) != 0:
            assert time.monotonic() < deadline and web.poll() is None, web.stdout.read() if web.stdout else ""
            time.sleep(0.2)
        with playwright.sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox", "--disable-gpu"])
            page = browser.new_page(viewport={"width": 1400, "height": 900})
            console = WebConsole(page)
            page.on("websocket", lambda ws: ws.on("framereceived", lambda frame: console.received.extend(
                frame if isinstance(frame, bytes) else frame.encode())))
            page.goto(f"http://127.0.0.1:{port}")
            console.wait_for(b"workers", b"prefill-0")
            # the page takes keys once it has the focus: a click on the pool panels at the top (which take no
            # focus and act on no click), so the workers table keeps the console's focus
            page.mouse.click(700, 70)
            yield console
            browser.close()
    finally:
        web.terminate()
        web.wait(10)


def test_the_web_console_shows_the_dashboard(tiny_model_dir: Path) -> None:
    playwright = pytest.importorskip("playwright.sync_api")
    with serve(tiny_model_dir, *FLEET) as url, web_console(playwright, url) as console:
        console.wait_for(b"read-only")


def test_the_help_key_in_the_browser_opens_the_help_screen(tiny_model_dir: Path) -> None:
    playwright = pytest.importorskip("playwright.sync_api")
    with serve(tiny_model_dir, *FLEET) as url, web_console(playwright, url) as console:
        console.press("?", re.escape(ACTIONS_BY_ID["help"].description.encode()), b"command palette")


def test_the_requests_view_opens_in_the_browser(tiny_model_dir: Path) -> None:
    playwright = pytest.importorskip("playwright.sync_api")
    with serve(tiny_model_dir, *FLEET) as url, web_console(playwright, url) as console:
        console.press("R", re.escape("requests · by age".encode()), rb"in flight")


def test_with_the_admin_token_the_web_console_acts_on_the_fleet(tiny_model_dir: Path) -> None:
    """Admin mode: drain is enabled (its confirm dialog, not the read-only warning) and the fleet takes the
    console's token: the worker drains and the console shows the operation's result."""
    playwright = pytest.importorskip("playwright.sync_api")
    # two of each role, so whichever row the cursor is on may drain (the last worker of a role may not): the test
    # moves no cursor, as which widget the page's click focused depends on the browser's font metrics
    fleet = ("--prefill", "2", "--decode", "2", "--devices", "cpu:0,cpu:1,cpu:2,cpu:3")
    with serve(tiny_model_dir, *fleet) as url, web_console(playwright, url, "--token", read_admin_token()) as console:
        since = len(console.received)
        console.press("d", DRAIN_QUESTION)
        worker = re.findall(DRAIN_QUESTION, console.text(since))[-1]
        console.press("y", re.escape(worker) + rb" drained: 0 session\(s\) finished")  # the operation's result
