"""The one client of a running fleet's `/fleet/*` API: `FleetClient` for the CLI and the demo, `AsyncFleetClient`
for the console. Both choose the URL and the admin token the same way, decode every failure in one place into
a typed error (`FleetUnreachable`, `FleetRefused` with its HTTP status, `FleetAnswerInvalid` for an answer that
is not the contract's), and return the contract's models (`engine/api/`), parsed in one place
(`_parse`). The schemas (pydantic) are imported on the first call, so that `fleetctl --help` does not pay for
them."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Generic, TypeVar

import httpx

from fleetctl.errors import FleetctlError

if TYPE_CHECKING:
    from pydantic import BaseModel

    from fleetctl.engine.api.checkpoints import CheckpointList
    from fleetctl.engine.api.history import FleetHistory
    from fleetctl.engine.api.operation_results import RebalancePreview
    from fleetctl.engine.api.operations import OperationInfo
    from fleetctl.engine.api.reports import DevicePeaks, FleetClassification, FleetPlan
    from fleetctl.engine.api.requests import RecentRequests
    from fleetctl.engine.api.status import FleetLogLines, FleetStatus, WorkerList, WorkerSessions

DEFAULT_URL = "http://127.0.0.1:8700"
Params = dict[str, str | float]
Answer = TypeVar("Answer", bound="BaseModel")


class FleetClientError(FleetctlError):
    """The fleet did not answer, or answered with an error; the message is one line for the user."""


class FleetUnreachable(FleetClientError):
    """Nothing answered at the URL (connection refused, timed out, broken off)."""

    hint = "start one with `fleetctl serve` or `fleetctl demo`, or point --url / $FLEET_URL at one"

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


class FleetAnswerInvalid(FleetClientError):
    """The fleet answered a success that is not the contract's model (another version, or not a fleet)."""

    def __init__(self, method: str, path: str, model: str, problem: str) -> None:
        super().__init__(f"{method} {path}: the answer is not a valid {model}: {problem}")
        self.model = model
        self.problem = problem


def fleet_url(url: str | None = None) -> str:
    """--url, else $FLEET_URL, else the default; `host:port` gets its `http://`."""
    chosen = url or os.environ.get("FLEET_URL") or DEFAULT_URL
    return (chosen if "://" in chosen else f"http://{chosen}").rstrip("/")


def _auth_headers(token: str | None) -> dict[str, str]:
    """The admin token given, else $FLEET_ADMIN_TOKEN or the token file a local fleet wrote."""
    from fleetctl.engine.api.admin_token import read_admin_token

    chosen = token or read_admin_token()
    return {"Authorization": f"Bearer {chosen}"} if chosen else {}


def _answer(response: httpx.Response, method: str, path: str) -> Any:
    """The JSON body of a success; the fleet's error message (or the start of its body) as FleetRefused."""
    if response.is_error:
        try:
            message = response.json()["error"]["message"]
        except (ValueError, KeyError, TypeError):
            message = response.text.strip()[:200]
        raise FleetRefused(method, path, response.status_code, message)
    try:
        return response.json()
    except ValueError:
        raise FleetAnswerInvalid(method, path, "JSON body", response.text.strip()[:80] or "empty") from None


@dataclass(frozen=True)
class _Call(Generic[Answer]):
    """One `/fleet/*` request and the model its answer is."""

    method: str
    path: str
    model: type[Answer]
    params: Params | None = None
    body: dict[str, object] | None = None


def _parse(call: _Call[Answer], body: Any) -> Answer:
    from pydantic import ValidationError

    try:
        return call.model.model_validate(body)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(part) for part in first["loc"]) or "the body"
        more = f" (and {exc.error_count() - 1} more)" if exc.error_count() > 1 else ""
        raise FleetAnswerInvalid(call.method, call.path, call.model.__name__,
                                 f"{where}: {first['msg']}{more}") from None


class _Calls:
    """Every typed call, declared once for both clients."""

    @staticmethod
    def status() -> _Call[FleetStatus]:
        from fleetctl.engine.api.status import FleetStatus

        return _Call("GET", "/fleet/status", FleetStatus)

    @staticmethod
    def workers() -> _Call[WorkerList]:
        from fleetctl.engine.api.status import WorkerList

        return _Call("GET", "/fleet/workers", WorkerList)

    @staticmethod
    def sessions(worker: str) -> _Call[WorkerSessions]:
        from fleetctl.engine.api.status import WorkerSessions

        return _Call("GET", f"/fleet/workers/{worker}/sessions", WorkerSessions)

    @staticmethod
    def checkpoints() -> _Call[CheckpointList]:
        from fleetctl.engine.api.checkpoints import CheckpointList

        return _Call("GET", "/fleet/checkpoints", CheckpointList)

    @staticmethod
    def operation(op_id: str) -> _Call[OperationInfo]:
        from fleetctl.engine.api.operations import OperationInfo

        return _Call("GET", f"/fleet/operations/{op_id}", OperationInfo)

    @staticmethod
    def start(path: str, body: dict[str, object]) -> _Call[OperationInfo]:
        from fleetctl.engine.api.operations import OperationInfo

        return _Call("POST", path, OperationInfo, body=body)

    @staticmethod
    def plan(params: Params) -> _Call[FleetPlan]:
        from fleetctl.engine.api.reports import FleetPlan

        return _Call("GET", "/fleet/plan", FleetPlan, params=params)

    @staticmethod
    def classify(params: Params) -> _Call[FleetClassification]:
        from fleetctl.engine.api.reports import FleetClassification

        return _Call("GET", "/fleet/classify", FleetClassification, params=params)

    @staticmethod
    def devices() -> _Call[DevicePeaks]:
        from fleetctl.engine.api.reports import DevicePeaks

        return _Call("GET", "/fleet/devices", DevicePeaks)

    @staticmethod
    def rebalance_preview(split: str, force: bool, via: str | None) -> _Call[RebalancePreview]:
        from fleetctl.engine.api.operation_results import RebalancePreview

        return _Call("POST", "/fleet/rebalance", RebalancePreview, body={"split": split, "apply": False,
                                                                        "force": force, "via": via})

    @staticmethod
    def history(params: Params) -> _Call[FleetHistory]:
        from fleetctl.engine.api.history import FleetHistory

        return _Call("GET", "/fleet/history", FleetHistory, params=params)

    @staticmethod
    def requests(params: Params) -> _Call[RecentRequests]:
        from fleetctl.engine.api.requests import RecentRequests

        return _Call("GET", "/fleet/requests", RecentRequests, params=params)

    @staticmethod
    def logs(params: Params) -> _Call[FleetLogLines]:
        from fleetctl.engine.api.status import FleetLogLines

        return _Call("GET", "/fleet/logs", FleetLogLines, params=params)


class FleetClient:
    def __init__(self, url: str | None = None, *, token: str | None = None, timeout: float = 10.0) -> None:
        self.url = fleet_url(url)
        self._http = httpx.Client(base_url=self.url, timeout=timeout, headers=_auth_headers(token))

    def status(self) -> FleetStatus:
        return self._call(_Calls.status())

    def workers(self) -> WorkerList:
        return self._call(_Calls.workers())

    def sessions(self, worker: str) -> WorkerSessions:
        return self._call(_Calls.sessions(worker))

    def checkpoints(self) -> CheckpointList:
        return self._call(_Calls.checkpoints())

    def operation(self, op_id: str) -> OperationInfo:
        return self._call(_Calls.operation(op_id))

    def start(self, path: str, body: dict[str, object]) -> OperationInfo:
        """POST an operation (its 202)."""
        return self._call(_Calls.start(path, body))

    def follow(self, op: OperationInfo, timeout: float,
               on_poll: Callable[[OperationInfo], None] | None = None) -> OperationInfo:
        """Poll /fleet/operations/{id} until `op` ends or `timeout` passes (`on_poll` sees each answer); returns
        its last state."""
        deadline = time.monotonic() + timeout
        while op.state == "running" and time.monotonic() < deadline:
            time.sleep(0.1)
            op = self.operation(op.id)
            if on_poll is not None:
                on_poll(op)
        return op

    def plan(self, params: Params) -> FleetPlan:
        return self._call(_Calls.plan(params))

    def classify(self, params: Params) -> FleetClassification:
        return self._call(_Calls.classify(params))

    def devices(self) -> DevicePeaks:
        return self._call(_Calls.devices())

    def rebalance_preview(self, split: str, force: bool = False, via: str | None = None) -> RebalancePreview:
        return self._call(_Calls.rebalance_preview(split, force, via))

    def history(self, params: Params) -> FleetHistory:
        return self._call(_Calls.history(params))

    def logs(self, params: Params) -> FleetLogLines:
        """`worker` (a worker id or "fleet"; all without), `since` (a line's seq), `limit`."""
        return self._call(_Calls.logs(params))

    def requests(self, params: Params) -> RecentRequests:
        """The last `limit` finished requests' timing breakdowns, and those in flight (`live`)."""
        return self._call(_Calls.requests(params))

    def get(self, path: str) -> Any:
        """The JSON of a route outside the `/fleet/*` contract (`/health`, `/v1/models`)."""
        return _answer(self._send("GET", path), "GET", path)

    def _call(self, call: _Call[Answer]) -> Answer:
        response = self._send(call.method, call.path, params=call.params, json=call.body)
        return _parse(call, _answer(response, call.method, call.path))

    def _send(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        try:
            return self._http.request(method, path, **kwargs)
        except httpx.HTTPError as exc:
            raise FleetUnreachable(self.url, exc.__class__.__name__) from None


class AsyncFleetClient:
    def __init__(self, url: str | None = None, *, token: str | None = None, timeout: float = 10.0) -> None:
        self.url = fleet_url(url)
        self._http = httpx.AsyncClient(base_url=self.url, timeout=timeout, headers=_auth_headers(token))

    async def status(self) -> FleetStatus:
        return await self._call(_Calls.status())

    async def workers(self) -> WorkerList:
        return await self._call(_Calls.workers())

    async def sessions(self, worker: str) -> WorkerSessions:
        return await self._call(_Calls.sessions(worker))

    async def checkpoints(self) -> CheckpointList:
        return await self._call(_Calls.checkpoints())

    async def operation(self, op_id: str) -> OperationInfo:
        return await self._call(_Calls.operation(op_id))

    async def start(self, path: str, body: dict[str, object]) -> OperationInfo:
        """POST an operation (its 202)."""
        return await self._call(_Calls.start(path, body))

    async def plan(self, params: Params) -> FleetPlan:
        return await self._call(_Calls.plan(params))

    async def classify(self, params: Params) -> FleetClassification:
        return await self._call(_Calls.classify(params))

    async def devices(self) -> DevicePeaks:
        return await self._call(_Calls.devices())

    async def rebalance_preview(self, split: str, force: bool = False, via: str | None = None) -> RebalancePreview:
        return await self._call(_Calls.rebalance_preview(split, force, via))

    async def history(self, params: Params) -> FleetHistory:
        return await self._call(_Calls.history(params))

    async def logs(self, params: Params) -> FleetLogLines:
        return await self._call(_Calls.logs(params))

    async def requests(self, params: Params) -> RecentRequests:
        return await self._call(_Calls.requests(params))

    async def _call(self, call: _Call[Answer]) -> Answer:
        try:
            response = await self._http.request(call.method, call.path, params=call.params, json=call.body)
        except httpx.HTTPError as exc:
            raise FleetUnreachable(self.url, exc.__class__.__name__) from None
        return _parse(call, _answer(response, call.method, call.path))

    async def close(self) -> None:
        await self._http.aclose()
