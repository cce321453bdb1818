"""`fleetctl console` decides between attaching and embedding: a fleet that answers at --url, $FLEET_URL or
the default URL gets the console attached to it; when none answers it starts an embedded fleet (the real
one, on the tiny model), attaches to that, and stops it when the console quits. The console itself runs
headless under Pilot in place of the terminal."""

import asyncio
from dataclasses import dataclass
from pathlib import Path

import pytest
from support.console_fixture import pilot_until
from support.fake_fleet_server import fake_fleet_url
from support.fleet_harness import free_port
from typer.testing import CliRunner

from fleetctl.console.cli import console as console_command
from fleetctl.console.cli.app import app as cli
from fleetctl.console.cli.console import answers
from fleetctl.console.tui.app import FleetConsole

FAKE_WORKERS = ["decode-0", "decode-1", "prefill-0"]  # fake_fleet_url's fleet


@dataclass(frozen=True)
class ConsoleSeen:
    url: str
    title: str
    workers: list[str]


@pytest.fixture
def consoles(monkeypatch: pytest.MonkeyPatch) -> list[ConsoleSeen]:
    """Each console the command runs, run headless until it has read its fleet, then quit with `q`."""
    seen: list[ConsoleSeen] = []

    def run_headless(app: FleetConsole) -> None:
        async def session() -> None:
            async with app.run_test(size=(120, 40)) as pilot:
                await pilot_until(pilot, lambda: app.reading.reachable, "a reading of its fleet")
                seen.append(ConsoleSeen(app.source.url, app.title, sorted(w.id for w in app.reading.workers)))
                await pilot.press("q")

        asyncio.run(session())

    monkeypatch.setattr(FleetConsole, "run", run_headless)
    monkeypatch.delenv("FLEET_URL", raising=False)
    return seen


def nothing_answers_at_the_default_url(monkeypatch: pytest.MonkeyPatch) -> str:
    url = f"http://127.0.0.1:{free_port()}"
    monkeypatch.setattr(console_command, "DEFAULT_URL", url)
    return url


@pytest.mark.parametrize("given", ["--url", "$FLEET_URL", "default URL"])
def test_a_fleet_that_answers_gets_the_console_attached(given: str, consoles: list[ConsoleSeen],
                                                        monkeypatch: pytest.MonkeyPatch, tiny_model_dir: Path,
                                                        tmp_path: Path) -> None:
    with fake_fleet_url(tiny_model_dir, tmp_path) as url:
        args = ["console", "--model", str(tiny_model_dir)]  # were it to embed one wrongly: no download
        if given == "--url":
            args += ["--url", url]
        elif given == "$FLEET_URL":
            monkeypatch.setenv("FLEET_URL", url)
        else:
            monkeypatch.setattr(console_command, "DEFAULT_URL", url)
        result = CliRunner().invoke(cli, args)
    assert result.exit_code == 0, result.output
    assert "embedded" not in result.output
    assert consoles == [ConsoleSeen(url, "fleetctl", FAKE_WORKERS)]


@pytest.mark.fleet
def test_with_no_fleet_answering_the_console_embeds_one_and_stops_it(consoles: list[ConsoleSeen],
                                                                     monkeypatch: pytest.MonkeyPatch,
                                                                     tiny_model_dir: Path) -> None:
    default_url = nothing_answers_at_the_default_url(monkeypatch)
    result = CliRunner().invoke(cli, ["console", "--model", str(tiny_model_dir)])
    assert result.exit_code == 0, result.output
    assert f"no fleet answers at {default_url}: starting an embedded one" in result.output
    [embedded] = consoles
    assert embedded.title == "fleetctl · embedded fleet" and "prefill-0" in embedded.workers
    assert embedded.url != default_url
    assert not answers(embedded.url)  # the embedded fleet stopped with the console
