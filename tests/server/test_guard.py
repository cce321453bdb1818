"""The server's front door (engine/server/guard.py), on a small app: Host and Origin checks, the admin
token for /fleet/* (closed when none is configured), and the request-body cap."""

import pytest
from fastapi import FastAPI, Request
from fastapi.testclient import TestClient

from fleetctl.engine.server.errors import fleetctl_error
from fleetctl.engine.server.guard import MAX_BODY_BYTES, TOO_LARGE, FleetGuard, is_loopback
from fleetctl.errors import FleetctlError

TOKEN = "s3cret-token"


def client(token: str | None = TOKEN, bound_host: str = "127.0.0.1") -> TestClient:
    app = FastAPI()
    app.add_exception_handler(FleetctlError, fleetctl_error)
    app.add_middleware(FleetGuard, bound_host=bound_host, admin_token=token)

    @app.get("/fleet/status")
    async def status() -> dict:
        return {"ok": True}

    @app.post("/fleet/workers/{wid}/stop")
    async def stop(wid: str) -> dict:
        return {"stopped": wid}

    @app.post("/v1/completions")
    async def completions(request: Request) -> dict:
        return {"bytes": len(await request.body())}

    return TestClient(app, base_url="http://127.0.0.1:8700")


def test_reads_on_loopback_are_open_and_changes_need_the_token() -> None:
    api = client()
    assert api.get("/fleet/status").status_code == 200
    assert api.post("/fleet/workers/decode-0/stop").status_code == 401
    assert api.post("/fleet/workers/decode-0/stop", headers={"Authorization": "Bearer wrong"}).status_code == 401
    ok = api.post("/fleet/workers/decode-0/stop", headers={"Authorization": f"Bearer {TOKEN}"})
    assert ok.status_code == 200 and ok.json() == {"stopped": "decode-0"}


@pytest.mark.parametrize("token", [None, ""])
def test_no_token_configured_fails_closed(token: str | None) -> None:
    api = client(token)
    refused = api.post("/fleet/workers/decode-0/stop", headers={"Authorization": "Bearer "})
    assert refused.status_code == 403 and "no admin token" in refused.json()["error"]["message"]


def test_beyond_loopback_reads_need_the_token_too() -> None:
    api = client(bound_host="0.0.0.0")
    assert api.get("/fleet/status", headers={"Host": "10.0.0.5:8700"}).status_code == 401
    assert api.get("/fleet/status", headers={"Host": "10.0.0.5:8700",
                                             "Authorization": f"Bearer {TOKEN}"}).status_code == 200
    assert api.post("/v1/completions", content=b"{}", headers={"Host": "10.0.0.5:8700"}).status_code == 200


@pytest.mark.parametrize("host", ["evil.example", "evil.example:8700", "192.168.1.9:8700"])
def test_a_host_header_that_does_not_name_the_server_is_refused(host: str) -> None:
    refused = client().get("/fleet/status", headers={"Host": host})
    assert refused.status_code == 421 and "does not name this server" in refused.json()["error"]["message"]


@pytest.mark.parametrize("host", ["127.0.0.1:8700", "localhost:8700", "[::1]:8700", "localhost"])
def test_loopback_names_are_accepted(host: str) -> None:
    assert client().get("/fleet/status", headers={"Host": host}).status_code == 200


def test_cross_origin_requests_are_refused() -> None:
    api = client()
    refused = api.post("/v1/completions", content=b"{}", headers={"Origin": "http://evil.example"})
    assert refused.status_code == 403
    assert api.post("/v1/completions", content=b"{}", headers={"Origin": "http://127.0.0.1:8700"}).status_code == 200


def test_bodies_over_the_cap_are_refused_with_or_without_a_length() -> None:
    api = client()
    big = b"x" * (MAX_BODY_BYTES + 1)
    assert api.post("/v1/completions", content=big).status_code == 413
    streamed = api.post("/v1/completions", content=iter([big[: MAX_BODY_BYTES // 2], big[MAX_BODY_BYTES // 2 :]]))
    assert streamed.status_code == 413
    assert streamed.json()["error"] == {"message": TOO_LARGE, "type": "invalid_request_error", "param": None,
                                        "code": None}
    assert api.post("/v1/completions", content=b"x" * 1000).json() == {"bytes": 1000}


@pytest.mark.parametrize(
    ("host", "expected"),
    [
        ("127.0.0.1", True),
        ("127.1.2.3", True),
        ("::1", True),
        ("localhost", True),
        ("0.0.0.0", False),  # every interface: beyond loopback
        ("::", False),
        ("10.0.0.1", False),
        ("192.168.1.20", False),
        ("fleet.example.com", False),
        ("localhost.example.com", False),
        ("", False),
    ],
)
def test_is_loopback(host: str, expected: bool) -> None:
    assert is_loopback(host) is expected
