"""The console quits promptly, in a real terminal (a pseudo-terminal): `q` on the embedded fleet leaves no
process of it (console, `fleetctl serve`, workers) and no handoff buffer within 5 s; a console whose fleet is
gone exits within 2 s of SIGTERM, or of SIGHUP (its terminal closed)."""

import signal
import time
from pathlib import Path

import pytest
from support.fleet_harness import free_port
from support.quitting import TerminalConsole, process_tree, seconds_until_all_gone

from fleetctl.console.cli.console import answers
from fleetctl.console.client import DEFAULT_URL

pytestmark = pytest.mark.fleet
QUIT_S = 5.0
SIGTERM_EXIT_S = 2.0


@pytest.mark.slow
@pytest.mark.skipif(answers(DEFAULT_URL), reason=f"a fleet answers at {DEFAULT_URL}: the console would attach to it")
def test_q_on_the_embedded_fleet_leaves_no_process_and_no_buffer_within_5_s(tiny_model_dir: Path) -> None:
    console = TerminalConsole("--model", str(tiny_model_dir))
    try:
        console.wait_for(b"decode-1", timeout=120)  # the embedded fleet's workers in the table
        everything = process_tree(console.process.pid)
        assert len(everything) >= 5, everything  # the console, serve, its three workers (and a resource tracker)
        pressed = time.monotonic()
        console.press(b"q")
        took = seconds_until_all_gone(everything, pressed, timeout=60, poll=console.drain)
    finally:
        console.close()
    assert took <= QUIT_S, f"{took:.1f} s"


@pytest.mark.parametrize("ending", [signal.SIGTERM, signal.SIGHUP], ids=["SIGTERM", "SIGHUP-terminal-closed"])
def test_a_console_whose_fleet_is_gone_exits_within_2_s_of_sigterm(ending: signal.Signals) -> None:
    console = TerminalConsole("--url", f"http://127.0.0.1:{free_port()}")
    try:
        console.wait_for(b"unreachable", timeout=60)
        signalled = time.monotonic()
        console.process.send_signal(ending)
        took = seconds_until_all_gone([process_tree(console.process.pid)[0]], signalled, timeout=30,
                                      poll=console.drain)
    finally:
        console.close()
    assert took <= SIGTERM_EXIT_S, f"{took:.1f} s"
    assert console.process.returncode == 0  # quit as on `q`, not killed by the signal
