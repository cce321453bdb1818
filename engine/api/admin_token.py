"""The admin bearer token that guards /fleet/* (the server's guard): `$FLEET_ADMIN_TOKEN`, or a token generated once
into `$FLEET_HOME/admin-token` (mode 0600) by the fleet, which the CLI and console read: a file of the contract."""

import os
import secrets
from pathlib import Path

from fleetctl.engine.paths import fleet_home
from fleetctl.errors import UserError


def admin_token_path() -> Path:
    return fleet_home() / "admin-token"


def load_or_create_admin_token() -> str:
    """$FLEET_ADMIN_TOKEN, else the token in $FLEET_HOME/admin-token (created mode 0600 if missing)."""
    if token := os.environ.get("FLEET_ADMIN_TOKEN"):
        return token
    path = admin_token_path()
    if path.exists():
        token = path.read_text().strip()
        if not token:
            raise UserError(f"{path} is empty: delete it and a new token is generated at the next start")
        return token
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    token = secrets.token_urlsafe(32)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(token + "\n")
    return token


def read_admin_token() -> str | None:
    """For clients: the token to send, if one is configured."""
    if token := os.environ.get("FLEET_ADMIN_TOKEN"):
        return token
    path = admin_token_path()
    return path.read_text().strip() if path.exists() else None
