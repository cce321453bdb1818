"""The console's settings model (console/console_settings.py): made directly it reads neither a settings file nor
the environment; its interval is bounded by the `--interval` option's declaration and its key bindings must be
names; the command line offers its options as declared."""

import pytest
from pydantic import ValidationError

from fleetctl.console.console_settings import INTERVAL, ConsoleSettings
from fleetctl.options import placed


def test_made_directly_it_reads_no_file_and_no_environment(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path))
    (tmp_path / "fleetctl").mkdir()
    (tmp_path / "fleetctl" / "config.toml").write_text("readonly = true\n")
    monkeypatch.setenv("READONLY", "true")
    assert ConsoleSettings() == ConsoleSettings(readonly=False, theme=None, interval=1.0, keys={})


@pytest.mark.parametrize("interval", [INTERVAL.min, 1, INTERVAL.max])
def test_an_interval_within_the_declared_bounds_is_kept(interval: float) -> None:
    assert ConsoleSettings(interval=interval).interval == interval


@pytest.mark.parametrize("interval", [0.1, 61, "2", True])
def test_an_interval_outside_them_or_not_a_number_is_refused(interval: object) -> None:
    with pytest.raises(ValidationError, match=r"interval must be a number of seconds in \[0.2, 60\]"):
        ConsoleSettings(interval=interval)


def test_key_bindings_must_be_names_and_unknown_settings_are_refused() -> None:
    with pytest.raises(ValidationError, match="maps binding ids to key names"):
        ConsoleSettings(keys={"migrate": 7})
    with pytest.raises(ValidationError, match="colour"):
        ConsoleSettings(colour="red")


def test_the_command_line_offers_readonly_theme_and_interval() -> None:
    shown = {p.option.name: (p.default, p.option.min, p.option.max) for p in placed(ConsoleSettings)}
    assert shown == {"readonly": (False, None, None), "theme": (None, None, None), "interval": (None, 0.2, 60.0)}
