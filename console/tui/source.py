"""Where the console's data comes from and where its actions go: a fleet's HTTP API (`/fleet/*`),
with history read from a local store when the console has one (faster, and the same function the
server's `/fleet/history` runs) or through `/fleet/history` when it is attached from afar.

All I/O is async (httpx) or runs in a thread (SQLite, psutil), so the UI thread never waits."""

import asyncio
from pathlib import Path
from typing import Protocol

import httpx

from fleetctl.console.tui.host import HostProbe
from fleetctl.console.tui.snapshot import HISTORY_BUCKET_S, HISTORY_WINDOW_S, FleetSnapshot


class ActionError(RuntimeError):
    """The fleet refused an action (or did not answer); the message is one line for the operator."""


class FleetSource(Protocol):
    url: str

    async def snapshot(self) -> FleetSnapshot: ...

    async def post(self, path: str, body: dict) -> dict: ...

    async def get(self, path: str) -> dict: ...

    async def close(self) -> None: ...


class HttpSource:
    def __init__(self, url: str, token: str | None, store: Path | None = None, timeout_s: float = 5.0) -> None:
        self.url = url
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self._http = httpx.AsyncClient(base_url=url, headers=headers, timeout=timeout_s)
        self._store = store
        self._host = HostProbe()

    async def snapshot(self) -> FleetSnapshot:
        try:
            status = (await self._http.get("/fleet/status")).raise_for_status().json()
        except httpx.HTTPError as exc:
            return FleetSnapshot(reachable=False, error=_describe(exc, self.url))
        history = await self._history()
        host = await asyncio.to_thread(self._host.sample, [w["pid"] for w in status["workers"] if w["pid"]])
        return FleetSnapshot(reachable=True, status=status, history=history, host=host)

    async def _history(self) -> dict:
        if self._store is not None and self._store.exists():
            return await asyncio.to_thread(_local_history, self._store)
        try:
            response = await self._http.get("/fleet/history",
                                            params={"since": HISTORY_WINDOW_S, "bucket": HISTORY_BUCKET_S})
        except httpx.HTTPError:
            return {}
        return response.json() if response.status_code == 200 else {}

    async def get(self, path: str) -> dict:
        return await self._request("GET", path)

    async def post(self, path: str, body: dict) -> dict:
        return await self._request("POST", path, body)

    async def _request(self, method: str, path: str, body: dict | None = None) -> dict:
        try:
            response = await self._http.request(method, path, json=body)
        except httpx.HTTPError as exc:
            raise ActionError(_describe(exc, self.url)) from None
        if response.is_error:
            try:
                message = response.json()["error"]["message"]
            except (ValueError, KeyError, TypeError):
                message = response.text.strip()[:200]
            raise ActionError(f"HTTP {response.status_code}: {message}")
        return response.json()

    async def close(self) -> None:
        await self._http.aclose()
        self._host.close()


def _local_history(path: Path) -> dict:
    from fleetctl.store.db import open_db
    from fleetctl.store.history import history

    db = open_db(path, check_same_thread=False)
    try:
        return history(db, HISTORY_WINDOW_S, HISTORY_BUCKET_S)
    finally:
        db.close()


def _describe(exc: httpx.HTTPError, url: str) -> str:
    if isinstance(exc, httpx.HTTPStatusError):
        return f"{url} answered HTTP {exc.response.status_code}"
    return f"no fleet answers at {url} ({exc.__class__.__name__})"
