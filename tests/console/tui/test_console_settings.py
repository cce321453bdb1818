"""The operator's settings (console/tui/settings.py) in a running console: config.toml from
$XDG_CONFIG_HOME is read, a `[keys]` rebinding is the key the console answers to (and the one its help
shows), a config that names something that does not exist is one error line from `fleetctl console`,
and the theme switched with `t` is remembered in $XDG_STATE_HOME for the next start."""

import asyncio
from pathlib import Path

import pytest
from support.console_fixture import FixtureSource, pilot_until
from typer.testing import CliRunner

from fleetctl.console.cli.app import app as cli
from fleetctl.console.tui.actions import ACTIONS_BY_ID
from fleetctl.console.tui.app import FleetConsole
from fleetctl.console.tui.screens.help import HelpScreen
from fleetctl.console.tui.settings import load_settings
from fleetctl.themes import DEFAULT_THEME

SIZE = (120, 40)


@pytest.fixture
def config_dir(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """An empty $XDG_CONFIG_HOME/fleetctl and $XDG_STATE_HOME for this test."""
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    folder = tmp_path / "config" / "fleetctl"
    folder.mkdir(parents=True)
    return folder


def help_rows(screen: HelpScreen) -> dict[str, str]:
    """The help table as {action description: key}."""
    return {what: key for key, what in screen.rows}


def test_a_rebinding_in_config_toml_is_the_key_the_console_answers_to(config_dir: Path) -> None:
    (config_dir / "config.toml").write_text('readonly = true\ninterval = 0.5\n[keys]\nhelp = "k"\n')
    settings = load_settings()
    assert (settings.readonly, settings.interval, settings.keys) == (True, 0.5, {"help": "k"})

    async def run() -> tuple[bool, dict[str, str], str]:
        app = FleetConsole(FixtureSource(), settings)
        async with app.run_test(size=SIZE) as pilot:
            await pilot_until(pilot, lambda: app.reading.reachable, "a reading")
            await pilot.press("question_mark")  # the default key no longer opens the help
            await pilot.pause(0.1)
            default_key_opened_help = isinstance(app.screen, HelpScreen)
            await pilot.press("k")
            await pilot_until(pilot, lambda: isinstance(app.screen, HelpScreen), "the help screen")
            return default_key_opened_help, help_rows(app.screen), app.sub_title

    default_key_opened_help, rows, sub_title = asyncio.run(run())
    assert not default_key_opened_help
    assert rows[ACTIONS_BY_ID["help"].description] == "k"
    assert rows[ACTIONS_BY_ID["migrate"].description + " (disabled)"] == "m"
    assert sub_title.endswith("read-only")


@pytest.mark.parametrize(("config", "message"), [
    ('[keys]\nmigrat = "M"\n', "[keys] names no console action: migrat (binding ids: migrate, "),
    ('[keys]\nmigrate = 7\n', "[keys] maps binding ids to key names"),
    ('colour = "red"\n', "unknown setting(s) colour"),
    ("interval = 0.01\n", "interval must be a number of seconds in [0.2, 60]"),
    ("readonly = \n", "config.toml: "),
])
def test_a_bad_config_is_one_error_line_from_the_console_command(config_dir: Path, config: str,
                                                                 message: str) -> None:
    (config_dir / "config.toml").write_text(config)
    # an unknown --theme is the command's next check: a config it wrongly accepted fails there, not in a console
    result = CliRunner().invoke(cli, ["console", "--url", "http://127.0.0.1:9", "--theme", "no-such-theme"])
    assert result.exit_code != 0
    assert result.stderr.splitlines() == [result.stderr.strip()], result.stderr
    assert result.stderr.startswith(f"fleetctl: error: {config_dir / 'config.toml'}: ") and message in result.stderr


def test_the_switched_theme_is_remembered_for_the_next_start(config_dir: Path) -> None:
    async def start_and_press(*keys: str) -> str:
        app = FleetConsole(FixtureSource(), load_settings())
        async with app.run_test(size=SIZE) as pilot:
            await pilot_until(pilot, lambda: app.reading.reachable, "a reading")
            await pilot.press(*keys)
            await pilot.pause(0.1)
            return app.theme

    switched = asyncio.run(start_and_press("t"))
    assert switched != DEFAULT_THEME
    assert asyncio.run(start_and_press()) == switched
    assert asyncio.run(start_and_press("t")) == DEFAULT_THEME
    assert load_settings().theme == DEFAULT_THEME
