"""Who may talk to a fleet's server, checked before any route runs (a pure ASGI middleware):

- a request whose Host header does not name this server is refused (DNS rebinding: a web page on
  evil.example that resolves its name to 127.0.0.1 must not reach the fleet);
- a browser request from another origin is refused (a page must not drive the fleet's API);
- a request body larger than MAX_BODY_BYTES is refused before it is read (413);
- /fleet/* needs `Authorization: Bearer <admin token>`: calls that change the fleet always, reads too
  when the server listens beyond loopback. No token configured (or an empty one) refuses them: closed,
  never open. /v1/* (the OpenAI API) needs `Bearer <api key>` when one is set (`--api-key`,
  `$FLEET_API_KEY`), as vLLM's does; /health, /version and /metrics stay open.
"""

import ipaddress
import json
import secrets
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from fleetctl.errors import UserError

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

MAX_BODY_BYTES = 8 << 20  # a prompt of the largest context in any tokenizer fits many times over
TOO_LARGE = f"the request body is larger than {MAX_BODY_BYTES >> 20} MiB"
READS = ("GET", "HEAD", "OPTIONS")
LOOPBACK_NAMES = ("127.0.0.1", "localhost", "::1")


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class FleetGuard:
    def __init__(self, app: ASGIApp, *, bound_host: str, admin_token: str | None, api_key: str | None = None) -> None:
        self.app = app
        self.bound_host = bound_host
        self.token = admin_token or None  # "" is no token: nothing that needs one gets through
        self.api_key = api_key or None
        self.loopback = is_loopback(bound_host)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        refusal = self._refusal(scope, headers)
        if refusal is not None:
            await send_error(send, *refusal)
            return
        length = headers.get("content-length")
        if length is not None and (not length.isdigit() or int(length) > MAX_BODY_BYTES):
            await send_error(send, 413, TOO_LARGE, "invalid_request_error")
            return
        await self.app(scope, _capped(receive), send)

    def _refusal(self, scope: Scope, headers: dict[str, str]) -> tuple[int, str, str] | None:
        host = _hostname(headers.get("host", ""))
        if self.loopback and host not in (*LOOPBACK_NAMES, self.bound_host):
            return 421, f"Host {host!r} does not name this server", "invalid_request_error"
        origin = headers.get("origin")
        if origin is not None and _hostname(origin.split("://", 1)[-1]) != host:
            return 403, f"cross-origin requests are refused (Origin {origin})", "permission_error"
        path, method = scope["path"], scope["method"]
        sent = headers.get("authorization", "")
        if path.startswith("/v1/") and self.api_key is not None and not _bearer(sent, self.api_key):
            return 401, "missing or wrong API key (Authorization: Bearer <key>)", "authentication_error"
        if not path.startswith("/fleet/") or (method in READS and self.loopback):
            return None
        if self.token is None:
            return 403, "no admin token is configured: /fleet/* is closed", "permission_error"
        if not _bearer(sent, self.token):
            return 401, "missing or wrong admin token (Authorization: Bearer …; see $FLEET_HOME/admin-token)", \
                "authentication_error"
        return None


def _bearer(sent: str, secret: str) -> bool:
    return secrets.compare_digest(sent.encode(), f"Bearer {secret}".encode())


def _hostname(authority: str) -> str:
    """'127.0.0.1:8700' -> '127.0.0.1'; '[::1]:8700' -> '::1'."""
    if authority.startswith("["):
        return authority[1:].split("]", 1)[0]
    return authority.rsplit(":", 1)[0] if authority.count(":") == 1 else authority


def _capped(receive: Receive) -> Receive:
    """A receive channel that stops a body (even one sent without Content-Length) at MAX_BODY_BYTES."""
    seen = 0

    async def capped() -> MutableMapping[str, Any]:
        nonlocal seen
        message = await receive()
        if message["type"] == "http.request":
            seen += len(message.get("body", b""))
            if seen > MAX_BODY_BYTES:
                raise BodyTooLarge(TOO_LARGE)
        return message

    return capped


class BodyTooLarge(UserError):
    """Raised inside the app when a streamed body passes the cap."""

    http_status = 413


async def send_error(send: Send, status: int, message: str, kind: str, headers: dict[str, str] | None = None) -> None:
    """An answer with OpenAI's error body, from an ASGI middleware (before any route runs)."""
    body = json.dumps({"error": {"message": message, "type": kind, "param": None, "code": None}}).encode()
    extra = [(name.lower().encode("latin-1"), value.encode("latin-1")) for name, value in (headers or {}).items()]
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                            *extra]})
    await send({"type": "http.response.body", "body": body})
