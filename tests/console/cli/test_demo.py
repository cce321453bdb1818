"""`fleetctl demo` as a user runs it: headless with --json on a real embedded fleet of the tiny model,
the console path on a terminal (the real console driven headless, Ctrl-C from the terminal), and the
one-line failures."""

import json
import os
import pty
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from support.fleet_harness import fleetctl, wait_until

SUMMARY_KEYS = {"model", "url", "embedded", "phase_seconds", "duration_s", "requests", "completed", "errors",
                "cancelled", "pools", "phases", "by_kind", "ttft_s", "tpot_s", "handoffs", "first_error"}


@pytest.mark.fleet
def test_headless_json_shows_model_time_swing_from_prefill_to_decode(tiny_model_dir: Path) -> None:
    """Why the shares must move, on any machine and under load: every RAG request has a prompt of
    >= 128 tokens and <= 16 output tokens, every agent request <= 32 and >= 64 (test_demo_schedule),
    and a request's model time is its token-share of the steps it ran in. A loaded machine slows every
    step, and the arrival rate follows the measured latency (Little's law) so each 8 s phase still gets
    requests; measured here: RAG ~50 % decode, agent ~87 %, a gap no scheduling noise closes."""
    result = fleetctl("demo", "--headless", "--duration", "20", "--json", "--model", str(tiny_model_dir),
                      "--phase-seconds", "8", timeout=300)
    assert result.returncode == 0, result.stderr
    summary = json.loads(result.stdout)  # one object and nothing else on stdout
    assert set(summary) == SUMMARY_KEYS and summary["embedded"] and summary["first_error"] is None
    assert [(p["kind"], p["start_s"], p["end_s"]) for p in summary["phases"]] == [
        ("rag", 0.0, 8.0), ("agent", 8.0, 16.0), ("rag", 16.0, pytest.approx(20.0, abs=0.5))]
    assert all(p["requests"] > 0 for p in summary["phases"]) and summary["errors"] == 0
    pools = summary["pools"]
    assert set(pools) == {"prefill", "decode"} and pools["decode"]["workers"] == 2
    assert pools["prefill"]["busy"] > 0 and pools["decode"]["busy"] > 0
    rag, agent = summary["by_kind"]["rag"], summary["by_kind"]["agent"]
    assert agent["decode_share"] > rag["decode_share"] and rag["prefill_share"] > agent["prefill_share"]
    assert summary["ttft_s"]["p50"] > 0 and summary["tpot_s"]["p99"] >= summary["tpot_s"]["p50"] > 0
    assert summary["handoffs"]["count"] > 0 and summary["handoffs"]["bytes"] > 0


@pytest.mark.fleet
def test_the_headless_tour_performs_and_checks_every_step(tiny_model_dir: Path) -> None:
    """`demo --tour --headless --json` on the tiny model: a live migration, a role switch, a checkpoint and
    restore, a worker killed and restarted, a rebalance to the planner's layout — each done through the API
    while the traffic streams, each passed, and no request lost to them."""
    result = fleetctl("demo", "--headless", "--tour", "--tour-pause", "2", "--duration", "10", "--json", "--model",
                      str(tiny_model_dir), "--phase-seconds", "8", timeout=600)
    assert result.returncode == 0, result.stderr
    summary = json.loads(result.stdout)
    tour = summary["tour"]
    assert [step["name"] for step in tour] == ["live migration", "role switch", "checkpoint and restore",
                                               "worker killed", "rebalance"]
    assert all(step["ok"] for step in tour), tour
    assert "is now mixed-0" in tour[1]["result"] and "runs again as process" in tour[3]["result"]
    assert summary["errors"] == 0 and summary["completed"] > 0
    announced = [line for line in result.stderr.splitlines() if line.startswith("fleetctl tour: ")]
    assert len(announced) == 2 * len(tour)  # what each step is about to do, then how it ended


# Runs the CLI with the real console, driven headless (Textual's `run_test`) instead of on the terminal: once
# it shows the demo's traffic on the fleet it records what it showed, then presses Ctrl-C the way a terminal does.
HEADLESS_CONSOLE = """
import asyncio, json, os, signal, sys, time

from fleetctl.console.tui.app import FleetConsole
from fleetctl.console.tui.widgets.workers import WorkersTable

# Ctrl-C interrupts, as on a terminal, also when the suite itself runs in the background (where a shell
# starts commands with SIGINT ignored, and children inherit that)
signal.signal(signal.SIGINT, signal.default_int_handler)

def run_headless(console):
    async def drive():
        async with console.run_test(size=(120, 40)) as pilot:
            busy = lambda: any(w.sessions or w.tokens_per_s > 0 for w in console.reading.workers)
            deadline = time.monotonic() + 120
            while not busy() and time.monotonic() < deadline:
                await pilot.pause(0.2)
            rows = [key.value for key in console.query_one(WorkersTable).rows]
            return {"url": console.source.url, "title": console.title, "readonly": console.readonly,
                    "store": str(console.source._store), "rows": rows, "reachable": console.reading.reachable,
                    "busy": busy()}

    with open(os.environ["CONSOLE_SHOWED"], "w") as f:
        json.dump(asyncio.run(drive()), f)
    os.killpg(0, signal.SIGINT)
    time.sleep(60)

FleetConsole.run = run_headless
sys.argv = ["fleetctl", "demo", *sys.argv[1:]]
from fleetctl.console.cli.app import main
main()
"""


def _group_alive(pgid: int) -> bool:
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid and fields[0] != "Z":
            return True
    return False


@pytest.mark.fleet
def test_on_a_terminal_it_runs_the_console_and_ctrl_c_stops_everything(tiny_model_dir: Path,
                                                                       fleet_home: Path, tmp_path: Path) -> None:
    showed_file = tmp_path / "console-showed.json"
    main_fd, terminal = pty.openpty()
    try:
        proc = subprocess.Popen([sys.executable, "-c", HEADLESS_CONSOLE, "--model", str(tiny_model_dir)],
                                stdin=terminal, stdout=terminal, stderr=subprocess.PIPE, text=True,
                                start_new_session=True, env={**os.environ, "CONSOLE_SHOWED": str(showed_file)})
        _, stderr = proc.communicate(timeout=300)
    finally:
        os.close(terminal)
        os.close(main_fd)
    assert proc.returncode == 130, stderr
    assert stderr == "fleetctl: error: interrupted\n"
    showed = json.loads(showed_file.read_text())
    assert showed["url"].startswith("http://127.0.0.1:") and showed["readonly"] is False
    assert "fleetctl demo" in showed["title"] and showed["title"].endswith(" · embedded fleet")
    assert showed["store"] == str(fleet_home / "fleet.db")
    assert showed["reachable"] and showed["rows"] == ["prefill-0", "decode-0", "decode-1"]
    assert showed["busy"]  # the traffic ran behind the console, and the console saw it
    assert wait_until(lambda: not _group_alive(proc.pid), 10), "a fleet process outlived the demo"


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# The headless path must never import the console: a None entry in sys.modules makes that import fail.
NO_CONSOLE = """
import sys
sys.modules["fleetctl.console.tui"] = None
sys.argv = ["fleetctl", "demo", *sys.argv[1:]]
from fleetctl.console.cli.app import main
main()
"""


def test_without_a_terminal_it_runs_headless_and_fails_in_one_line(tmp_path: Path) -> None:
    url = f"http://127.0.0.1:{_closed_port()}"
    store = tmp_path / "fleet.db"
    no_store = subprocess.run([sys.executable, "-c", NO_CONSOLE, "--url", url, "--store", str(store)],
                              capture_output=True, text=True, timeout=60)
    assert (no_store.returncode, no_store.stdout) == (1, "")
    assert no_store.stderr.splitlines() == [
        "fleetctl: no terminal on stdout: running headless for 60 s",
        f"fleetctl: error: no metrics store at {store}: pass --store with the store the fleet at {url} writes",
    ]
    store.touch()
    no_fleet = subprocess.run([sys.executable, "-c", NO_CONSOLE, "--url", url, "--store", str(store), "--json",
                               "--duration", "5"], capture_output=True, text=True, timeout=60)
    assert (no_fleet.returncode, no_fleet.stdout) == (1, "")
    assert no_fleet.stderr.splitlines() == [
        "fleetctl: no terminal on stdout: running headless for 5 s",
        f"fleetctl: error: no fleet answers at {url} (ConnectError): start one with `fleetctl serve` or "
        "`fleetctl demo`, or point --url / $FLEET_URL at one",
    ]
