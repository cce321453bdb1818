"""The operator's console settings (`ConsoleSettings`) as read from `$XDG_CONFIG_HOME/fleetctl/config.toml` (read,
never written) through pydantic-settings' TOML source, and the remembered theme in
`$XDG_STATE_HOME/fleetctl/console.json`.

    readonly = true            # every action disabled, in every view
    theme = "fleet-light"
    interval = 2.0             # seconds between refreshes
    [keys]                     # binding id = key(s), comma-separated
    migrate = "M"
    help = "question_mark,f1"
"""

import json
import os
import tomllib
from pathlib import Path
from typing import Any

from pydantic import ValidationError
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict, TomlConfigSettingsSource

from fleetctl.console.console_settings import ConsoleSettings
from fleetctl.console.tui.actions import ACTIONS_BY_ID
from fleetctl.errors import UserError


def config_path() -> Path:
    base = os.environ.get("XDG_CONFIG_HOME") or "~/.config"
    return Path(base).expanduser() / "fleetctl" / "config.toml"


def state_path() -> Path:
    base = os.environ.get("XDG_STATE_HOME") or "~/.local/state"
    return Path(base).expanduser() / "fleetctl" / "console.json"


class SettingsFile(ConsoleSettings, BaseSettings):
    """ConsoleSettings as pydantic-settings reads them: those given (the command line's) over the settings file's
    (no file: none); no environment variables."""

    model_config = SettingsConfigDict(frozen=True, extra="forbid")

    @classmethod
    def settings_customise_sources(cls, settings_cls: type[BaseSettings], init_settings: PydanticBaseSettingsSource,
                                   **_: PydanticBaseSettingsSource) -> tuple[PydanticBaseSettingsSource, ...]:
        return init_settings, TomlConfigSettingsSource(settings_cls, toml_file=config_path())


def load_settings(**given: Any) -> ConsoleSettings:
    """The settings of `config_path()` under those `given` (the command line's); without a theme, the one
    remembered."""
    path = config_path()
    try:
        settings = SettingsFile(**given)
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise UserError(f"{path}: {exc}") from None
    except ValidationError as exc:
        raise UserError(f"{path}: {problems(exc)}") from None
    if unknown := set(settings.keys) - set(ACTIONS_BY_ID):
        raise UserError(f"{path}: [keys] names no console action: {', '.join(sorted(unknown))} "
                            f"(binding ids: {', '.join(ACTIONS_BY_ID)})")
    return settings if settings.theme else settings.model_copy(update={"theme": remembered_theme()})


def problems(error: ValidationError) -> str:
    """A settings file's mistakes, in one line."""
    unknown = [str(e["loc"][0]) for e in error.errors() if e["type"] == "extra_forbidden"]
    said = [str(e["ctx"]["error"]) if e["type"] == "value_error" else f"{'.'.join(map(str, e['loc']))}: {e['msg']}"
            for e in error.errors() if e["type"] != "extra_forbidden"]
    return "; ".join([f"unknown setting(s) {', '.join(sorted(unknown))}"] * bool(unknown) + said)


def remembered_theme() -> str | None:
    try:
        return json.loads(state_path().read_text()).get("theme")
    except (OSError, ValueError, AttributeError):
        return None


def remember_theme(name: str) -> None:
    path = state_path()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({"theme": name}))
    except OSError:
        pass  # a read-only home forgets the choice; the console still works
