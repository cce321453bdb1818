"""The operator's console settings: `$XDG_CONFIG_HOME/fleetctl/config.toml` (read, never written) and
the remembered theme in `$XDG_STATE_HOME/fleetctl/console.json`.

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
from dataclasses import dataclass, field
from pathlib import Path

from fleetctl.console.tui.actions import ACTIONS_BY_ID
from fleetctl.errors import UserError


@dataclass(frozen=True)
class ConsoleSettings:
    readonly: bool = False
    theme: str | None = None
    interval: float = 1.0
    keys: dict[str, str] = field(default_factory=dict)  # binding id -> keys


def config_path() -> Path:
    base = os.environ.get("XDG_CONFIG_HOME") or "~/.config"
    return Path(base).expanduser() / "fleetctl" / "config.toml"


def state_path() -> Path:
    base = os.environ.get("XDG_STATE_HOME") or "~/.local/state"
    return Path(base).expanduser() / "fleetctl" / "console.json"


def load_settings(path: Path | None = None) -> ConsoleSettings:
    path = path or config_path()
    if not path.exists():
        return ConsoleSettings(theme=remembered_theme())
    try:
        raw = tomllib.loads(path.read_text())
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise UserError(f"{path}: {exc}") from None
    unknown = set(raw) - {"readonly", "theme", "interval", "keys"}
    if unknown:
        raise UserError(f"{path}: unknown setting(s) {', '.join(sorted(unknown))}")
    keys = raw.get("keys", {})
    if not isinstance(keys, dict) or not all(isinstance(v, str) for v in keys.values()):
        raise UserError(f"{path}: [keys] maps binding ids to key names, e.g. migrate = \"M\"")
    unknown_ids = set(keys) - set(ACTIONS_BY_ID)
    if unknown_ids:
        raise UserError(f"{path}: [keys] names no console action: {', '.join(sorted(unknown_ids))} "
                        f"(binding ids: {', '.join(ACTIONS_BY_ID)})")
    interval = raw.get("interval", 1.0)
    if not isinstance(interval, int | float) or not 0.2 <= interval <= 60:
        raise UserError(f"{path}: interval must be a number of seconds in [0.2, 60]")
    return ConsoleSettings(readonly=bool(raw.get("readonly", False)), theme=raw.get("theme") or remembered_theme(),
                           interval=float(interval), keys=dict(keys))


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
