"""The server answers each family of expected failure (`fleetctl.errors`) with its status and OpenAI's error body,
from the one handler — 400 bad input, 404 a name that names nothing, 409 refused in the fleet's state, 429 busy
(with Retry-After), 503 no worker left or a request the fleet could not finish — and a bug with a 500, never a
4xx. Over HTTP (FastAPI's TestClient) on a fleet of fake workers."""

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from support.fake_workers import FakeLauncher

from fleetctl.engine.fleet.controller import Fleet
from fleetctl.engine.fleet.fleet_config import FleetConfig, Supervision
from fleetctl.engine.server.app import create_app
from fleetctl.errors import UserError

TOKEN = "test-admin-token"
MODEL = "tiny-llama0"


@pytest.fixture
def serve(tiny_model_dir: Path, tmp_path: Path) -> Iterator:
    """A client of a fleet of fakes (prefill-0 on cpu:0, decode-0 on cpu:1) configured as the test asks."""
    clients: list[TestClient] = []

    def start(launcher: FakeLauncher | None = None, **config: object) -> TestClient:
        shm = tmp_path / "shm"
        shm.mkdir(exist_ok=True)
        fleet = Fleet(FleetConfig(tiny_model_dir, **{"prefill": 1, "decode": 1, "devices": ("cpu:0", "cpu:1"),
                                                     "shm_dir": shm} | config), launcher=launcher or FakeLauncher(shm))
        client = TestClient(create_app(fleet, TOKEN), base_url="http://127.0.0.1:8700",
                            headers={"Authorization": f"Bearer {TOKEN}"}, raise_server_exceptions=False)
        clients.append(client.__enter__())
        return client

    yield start
    for client in clients:
        client.__exit__(None, None, None)


def error(response, status: int) -> dict:
    assert response.status_code == status, response.text
    body = response.json()
    assert set(body) == {"error"} and set(body["error"]) == {"message", "type", "param", "code"}, body
    return body["error"]


def complete(client: TestClient, **fields: object):
    return client.post("/v1/completions", json={"model": MODEL, "prompt": [5, 6, 7], "max_tokens": 4} | fields)


def test_bad_input_is_400(serve) -> None:
    client = serve()
    assert error(complete(client, prompt=[10**7]), 400) == {
        "message": "prompt token ids must be in [0, 384)", "type": "invalid_request_error",
        "param": None, "code": None}  # PromptError, from the fleet's admission
    bad_id = client.post("/v1/completions", json={"model": MODEL, "prompt": [5], "max_tokens": 2},
                         headers={"X-Request-Id": "no spaces"})
    assert error(bad_id, 400)["message"] == "X-Request-Id must be 1-64 characters of A-Z a-z 0-9 . _ : -"
    assert error(client.post("/tokenize", json={}), 400)["message"] == "give exactly one of prompt or messages"
    history = error(client.get("/fleet/history", params={"since": 10, "bucket": 20}), 404)  # no store: 404 first
    assert history["type"] == "not_found_error"


def test_a_name_that_names_nothing_is_404(serve) -> None:
    client = serve()
    model = error(complete(client, model="gpt-9"), 404)
    assert (model["type"], model["code"]) == ("invalid_request_error", "model_not_found")  # as OpenAI answers
    assert model["message"] == f"The model `gpt-9` does not exist; this fleet serves `{MODEL}`."
    for path in ("/fleet/workers/decode-9/sessions", "/fleet/logs?worker=decode-9"):
        assert error(client.get(path), 404) == {"message": "unknown worker 'decode-9'", "type": "not_found_error",
                                               "param": None, "code": None}
    assert error(client.get("/fleet/operations/op-x"), 404)["message"] == "no operation 'op-x'"


def test_a_request_refused_in_the_fleets_state_is_409(serve) -> None:
    client = serve()
    refused = error(client.post("/fleet/workers/decode-0/stop", json={}), 409)
    assert "last running decode worker" in refused["message"] and refused["type"] == "invalid_request_error"


def test_a_busy_fleet_is_429_with_retry_after(serve) -> None:
    client = serve(max_queue=1)
    response = complete(client, n=2)  # the gate lets one request in; its two samples pass the queue
    assert error(response, 429) == {"message": "the fleet is busy: 0 requests are already waiting",
                                    "type": "rate_limit_error", "param": None, "code": None}
    assert response.headers["retry-after"] == "1"
    assert complete(client).status_code == 200


def test_no_worker_left_is_503(serve, tmp_path: Path) -> None:
    shm = tmp_path / "shm"
    shm.mkdir()
    client = serve(FakeLauncher(shm, die_after={"decode-0": 1}), supervision=Supervision(restart=False))
    failed = error(complete(client), 503)  # its decode worker died under it, and none is left to go on
    assert failed == {"message": "no decode worker is left to continue this request", "type": "service_unavailable",
                      "param": None, "code": None}
    deadline = time.monotonic() + 10
    while client.get("/health").status_code != 503 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert client.get("/health").json() == {"status": "degraded"}
    assert error(complete(client), 503) == {"message": "no decode worker is available", "type": "service_unavailable",
                                            "param": None, "code": None}


def test_a_bug_is_500_never_a_users_mistake(serve) -> None:
    client = serve()

    async def bug() -> None:
        raise KeyError("decode-0")

    async def mistake() -> None:
        raise UserError("a bad value")

    client.app.add_api_route("/v1/bug", bug)
    client.app.add_api_route("/v1/mistake", mistake)
    assert client.get("/v1/bug").status_code == 500
    assert error(client.get("/v1/mistake"), 400)["message"] == "a bad value"
