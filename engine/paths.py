"""Where fleetctl keeps its files: `$FLEET_HOME` (default `~/.local/share/fleetctl`), read on every
call so that tests and operators can point it elsewhere at any time."""

import os
from pathlib import Path


def fleet_home() -> Path:
    return Path(os.environ.get("FLEET_HOME") or "~/.local/share/fleetctl").expanduser()


def checkpoint_root() -> Path:
    return fleet_home() / "checkpoints"


def default_store_path() -> Path:
    """The SQLite metrics store a fleet writes and the console reads."""
    return fleet_home() / "fleet.db"


def store_file(given: str) -> Path:
    """The metrics store a `--store` option names: the path given, else the default one."""
    return Path(given).expanduser() if given else default_store_path()
