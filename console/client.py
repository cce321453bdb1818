"""The httpx client for a running fleet's /fleet/* API (shared by the CLI and, later, the console)."""

import os

import httpx

DEFAULT_URL = "http://127.0.0.1:8700"


class FleetClientError(RuntimeError):
    """The fleet did not answer, or answered with an error; the message is one line for the user."""


def fleet_url(url: str | None = None) -> str:
    """--url, else $FLEET_URL, else the default; `host:port` gets its `http://`."""
    chosen = url or os.environ.get("FLEET_URL") or DEFAULT_URL
    return (chosen if "://" in chosen else f"http://{chosen}").rstrip("/")


class FleetClient:
    def __init__(self, url: str | None = None, timeout: float = 10.0) -> None:
        from fleetctl.engine.server.admin_auth import read_admin_token

        self.url = fleet_url(url)
        token = read_admin_token()
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self._http = httpx.Client(base_url=self.url, timeout=timeout, headers=headers)

    def get(self, path: str) -> dict:
        return self._request("GET", path)

    def post(self, path: str, body: dict | None = None) -> dict:
        return self._request("POST", path, json=body or {})

    def _request(self, method: str, path: str, **kwargs: object) -> dict:
        try:
            response = self._http.request(method, path, **kwargs)
        except httpx.HTTPError as exc:
            raise FleetClientError(f"no fleet answers at {self.url} ({exc.__class__.__name__}): start one with "
                                   f"`fleetctl serve` or `fleetctl demo`, or point --url / $FLEET_URL at one") from None
        if response.is_error:
            try:
                message = response.json()["error"]["message"]
            except (ValueError, KeyError, TypeError):
                message = response.text.strip()[:200]
            raise FleetClientError(f"{method} {path}: HTTP {response.status_code}: {message}")
        return response.json()
