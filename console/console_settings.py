"""What the operator's console runs with: `ConsoleSettings`, whose options (`fleetctl console --readonly --theme
--interval`) are declared here, and whose values come from the settings file (`console/tui/settings.py` reads it
through pydantic-settings' TOML source) under the command line's. Apart from the Textual console and from
pydantic-settings, so that the command line declares them without importing either."""

from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, field_validator

from fleetctl.options import CliOption
from fleetctl.themes import THEME_NAMES

DEFAULT_INTERVAL_S = 1.0
INTERVAL = CliOption("--interval", min=0.2, max=60.0, default=None,  # None on the command line: the file's
                     help=f"Seconds between refreshes ({DEFAULT_INTERVAL_S:g}).")


class ConsoleSettings(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    readonly: Annotated[bool, CliOption(
        "--readonly", help="Disable every action (also: readonly = true in config).")] = False
    theme: Annotated[str | None, CliOption(
        "--theme", help=f"{' or '.join(THEME_NAMES)} (remembered when switched with t).")] = None
    interval: Annotated[float, INTERVAL] = DEFAULT_INTERVAL_S
    keys: dict[str, str] = {}  # binding id -> keys, comma-separated

    @field_validator("interval", mode="before")
    @classmethod
    def _seconds(cls, value: Any) -> Any:
        if not isinstance(value, int | float) or isinstance(value, bool) or INTERVAL.out_of_bounds(value):
            raise ValueError(f"interval must be a number of seconds in [{INTERVAL.min:g}, {INTERVAL.max:g}]")
        return value

    @field_validator("keys", mode="before")
    @classmethod
    def _key_names(cls, keys: Any) -> Any:
        if not isinstance(keys, dict) or not all(isinstance(v, str) for v in keys.values()):
            raise ValueError('[keys] maps binding ids to key names, e.g. migrate = "M"')
        return keys
