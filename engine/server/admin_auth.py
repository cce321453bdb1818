"""The admin bearer token that guards /fleet/* when the server listens beyond loopback."""

import ipaddress
import os
import secrets
from pathlib import Path

from fleetctl.engine.paths import fleet_home


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def admin_token_path() -> Path:
    return fleet_home() / "admin-token"


def load_or_create_admin_token() -> str:
    """$FLEET_ADMIN_TOKEN, else the token in $FLEET_HOME/admin-token (created mode 0600 if missing)."""
    if token := os.environ.get("FLEET_ADMIN_TOKEN"):
        return token
    path = admin_token_path()
    if path.exists():
        return path.read_text().strip()
    path.parent.mkdir(parents=True, exist_ok=True)
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
