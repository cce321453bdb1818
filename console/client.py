"""The one client of a running fleet's `/fleet/*` API: `FleetClient` for the CLI and the demo, `AsyncFleetClient`
for the console. Both choose the URL and the admin token the same way and decode every failure in one place into
a typed error (`FleetUnreachable`, `FleetRefused` with its HTTP status), so that no caller reads a message."""

import os

import httpx

DEFAULT_URL = "http://127.0.0.1:8700"
Params = dict[str, str | float]


class FleetClientError(RuntimeError):
    """The fleet did not answer, or answered with an error; the message is one line for the user."""


class FleetUnreachable(FleetClientError):
    """Nothing answered at the URL (connection refused, timed out, broken off)."""

    def __init__(self, url: str, cause: str) -> None:
        super().__init__(f"no fleet answers at {url} ({cause})")
        self.url = url
        self.cause = cause  # the transport error's class name, e.g. ConnectError


class FleetRefused(FleetClientError):
    """The fleet answered with an HTTP error; `message` is the fleet's own reason."""

    def __init__(self, method: str, path: str, status: int, message: str) -> None:
        super().__init__(f"{method} {path}: HTTP {status}: {message}")
        self.status = status
        self.message = message


def fleet_url(url: str | None = None) -> str:
    """--url, else $FLEET_URL, else the default; `host:port` gets its `http://`."""
    chosen = url or os.environ.get("FLEET_URL") or DEFAULT_URL
    return (chosen if "://" in chosen else f"http://{chosen}").rstrip("/")


def _auth_headers(token: str | None) -> dict[str, str]:
    """The admin token given, else $FLEET_ADMIN_TOKEN or the token file a local fleet wrote."""
    from fleetctl.engine.server.admin_auth import read_admin_token

    chosen = token or read_admin_token()
    return {"Authorization": f"Bearer {chosen}"} if chosen else {}


def _answer(response: httpx.Response, method: str, path: str) -> dict:
    """The JSON body of a success; the fleet's error message (or the start of its body) as FleetRefused."""
    if response.is_error:
        try:
            message = response.json()["error"]["message"]
        except (ValueError, KeyError, TypeError):
            message = response.text.strip()[:200]
        raise FleetRefused(method, path, response.status_code, message)
    return response.json()


class FleetClient:
    def __init__(self, url: str | None = None, *, token: str | None = None, timeout: float = 10.0) -> None:
        self.url = fleet_url(url)
        self._http = httpx.Client(base_url=self.url, timeout=timeout, headers=_auth_headers(token))

    def get(self, path: str, params: Params | None = None) -> dict:
        return self._request("GET", path, params=params)

    def post(self, path: str, body: dict | None = None) -> dict:
        return self._request("POST", path, json=body or {})

    def _request(self, method: str, path: str, **kwargs: object) -> dict:
        try:
            response = self._http.request(method, path, **kwargs)
        except httpx.HTTPError as exc:
            raise FleetUnreachable(self.url, exc.__class__.__name__) from None
        return _answer(response, method, path)


class AsyncFleetClient:
    def __init__(self, url: str | None = None, *, token: str | None = None, timeout: float = 10.0) -> None:
        self.url = fleet_url(url)
        self._http = httpx.AsyncClient(base_url=self.url, timeout=timeout, headers=_auth_headers(token))

    async def get(self, path: str, params: Params | None = None) -> dict:
        return await self._request("GET", path, params=params)

    async def post(self, path: str, body: dict | None = None) -> dict:
        return await self._request("POST", path, json=body or {})

    async def _request(self, method: str, path: str, **kwargs: object) -> dict:
        try:
            response = await self._http.request(method, path, **kwargs)
        except httpx.HTTPError as exc:
            raise FleetUnreachable(self.url, exc.__class__.__name__) from None
        return _answer(response, method, path)

    async def close(self) -> None:
        await self._http.aclose()
