"""/fleet/* over HTTP (FastAPI's TestClient) on a fleet of in-process fake workers (tests/support/fake_workers.py):
the pool-change routes and their errors, and /fleet/history."""

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from support.fake_workers import FakeLauncher

from fleetctl.engine.fleet.controller import Fleet
from fleetctl.engine.fleet.fleet_config import FleetConfig
from fleetctl.engine.server.app import create_app

TOKEN = "test-admin-token"


def make_client(model_dir: Path, tmp_path: Path, store: bool = True) -> TestClient:
    (tmp_path / "shm").mkdir(exist_ok=True)
    config = FleetConfig(model_dir, prefill=1, decode=1, devices=("cpu:0", "cpu:1"), shm_dir=tmp_path / "shm",
                         store_path=tmp_path / "fleet.db" if store else None)
    app = create_app(Fleet(config, launcher=FakeLauncher(tmp_path / "shm")), TOKEN)
    return TestClient(app, base_url="http://127.0.0.1:8700", headers={"Authorization": f"Bearer {TOKEN}"})


@pytest.fixture
def client(tiny_model_dir: Path, tmp_path: Path) -> Iterator[TestClient]:
    with make_client(tiny_model_dir, tmp_path) as client:
        yield client


def accepted(client: TestClient, path: str, body: dict | None = None) -> dict:
    """POST an operation, check the 202, follow it to its end."""
    response = client.post(path, json=body)
    assert response.status_code == 202, response.text
    op = response.json()
    assert response.headers["location"] == f"/fleet/operations/{op['id']}"
    deadline = time.monotonic() + 10
    while op["state"] == "running" and time.monotonic() < deadline:
        time.sleep(0.01)
        op = client.get(f"/fleet/operations/{op['id']}").json()
    return op


def states(client: TestClient) -> dict[str, tuple[str, str]]:
    return {w["id"]: (w["state"], w["device"]) for w in client.get("/fleet/workers").json()["workers"]}


def test_start_drain_resume_stop_over_http(client: TestClient) -> None:
    started = accepted(client, "/fleet/workers", {"role": "decode", "device": "cpu:2"})
    assert started["state"] == "done" and started["kind"] == "start" and started["device"] == "cpu:2"
    assert started["result"]["worker"] == "decode-1" and started["result"]["role"] == "decode"
    assert states(client)["decode-1"] == ("running", "cpu:2")
    called = time.monotonic()
    drained = accepted(client, "/fleet/workers/decode-1/drain")
    wall = time.monotonic() - called
    assert drained["result"] == {"worker": "decode-1", "sessions_finished": 0, "seconds": drained["result"]["seconds"]}
    assert 0 <= drained["result"]["seconds"] <= wall + 0.001
    assert states(client)["decode-1"] == ("draining", "cpu:2")
    assert accepted(client, "/fleet/workers/decode-1/resume")["result"]["cancelled_operation"] is None
    assert states(client)["decode-1"] == ("running", "cpu:2")
    stopped = accepted(client, "/fleet/workers/decode-1/stop", {"force": True})
    assert stopped["state"] == "done" and stopped["result"]["sessions_moved"] == 0
    assert states(client)["decode-1"] == ("stopped", "cpu:2")
    done = client.post("/v1/completions", json={"model": "tiny-llama0", "prompt": [5, 6], "max_tokens": 4})
    assert done.status_code == 200


def test_switch_over_http_renames_the_worker_and_keeps_its_process(client: TestClient) -> None:
    accepted(client, "/fleet/workers", {"role": "decode", "device": "cpu:2"})
    pid = client.get("/fleet/workers").json()["workers"][-1]["pid"]
    switched = accepted(client, "/fleet/workers/decode-1/switch", {"role": "prefill"})
    assert switched["kind"] == "switch" and switched["state"] == "done", switched
    result = switched["result"]
    assert {k: result[k] for k in ("worker", "was", "from", "to", "pid", "sessions_moved")} == {
        "worker": "prefill-1", "was": "decode-1", "from": "decode", "to": "prefill", "pid": pid, "sessions_moved": 0}
    workers = {w["id"]: w for w in client.get("/fleet/workers").json()["workers"]}
    assert "decode-1" not in workers
    assert (workers["prefill-1"]["role"], workers["prefill-1"]["was"], workers["prefill-1"]["pid"]) == (
        "prefill", "decode-1", pid)
    assert workers["prefill-0"]["was"] is None
    again = accepted(client, "/fleet/workers/prefill-1/switch", {"role": "decode"})
    assert again["result"]["worker"] == "decode-2"  # decode-1 is the id it left: never given again
    done = client.post("/v1/completions", json={"model": "tiny-llama0", "prompt": [5, 6], "max_tokens": 4})
    assert done.status_code == 200


def test_bad_pool_changes_get_one_clear_error_and_change_nothing(client: TestClient) -> None:
    before = states(client)
    cases = [
        ("/fleet/workers", {"role": "gpu", "device": "cpu:2"}, 400, "unknown role 'gpu'"),
        ("/fleet/workers", {"role": "decode", "device": "tpu:0"}, 400, "unknown device 'tpu:0'"),
        ("/fleet/workers", {"role": "decode", "device": "cpu:0"}, 409, "cpu:0 already hosts prefill-0"),
        ("/fleet/workers", {"role": "decode"}, 400, "device: Field required"),
        ("/fleet/workers", None, 400, "Field required"),
        ("/fleet/workers/decode-9/drain", None, 404, "unknown worker 'decode-9'"),
        ("/fleet/workers/decode-9/resume", None, 404, "unknown worker 'decode-9'"),
        ("/fleet/workers/decode-9/stop", {"force": True}, 404, "unknown worker 'decode-9'"),
        ("/fleet/workers/decode-0/stop", {"force": "maybe"}, 400, "force"),
        ("/fleet/workers/decode-0/stop", None, 409, "last running decode worker"),
        ("/fleet/workers/prefill-0/drain", None, 409, "last running prefill worker"),
        ("/fleet/workers/decode-0/resume", None, 409, "decode-0 is running, not draining"),
        ("/fleet/workers/decode-9/switch", {"role": "prefill"}, 404, "unknown worker 'decode-9'"),
        ("/fleet/workers/decode-0/switch", {"role": "decode"}, 409, "decode-0 is already a decode worker"),
        ("/fleet/workers/decode-0/switch", {"role": "prefill"}, 409, "last running decode worker"),
        ("/fleet/workers/prefill-0/switch", {"role": "decode"}, 409, "last running prefill worker"),
        ("/fleet/workers/decode-0/switch", None, 400, "Field required"),
    ]
    for path, body, status, message in cases:
        response = client.post(path, json=body)
        assert response.status_code == status, (path, body, response.text)
        assert message in response.json()["error"]["message"], (path, body, response.text)
    assert states(client) == before


def test_history_of_the_fleets_store(client: TestClient) -> None:
    for prompt in ([5, 6, 7], [8, 9]):
        done = client.post("/v1/completions", json={"model": "tiny-llama0", "prompt": prompt, "max_tokens": 4})
        assert done.status_code == 200
    deadline = time.monotonic() + 10  # the recorder writes requests and worker samples in batches, about once a second
    history = client.get("/fleet/history", params={"since": 60, "bucket": 5}).json()
    while (history["traffic"]["requests"] < 2 or len(history["workers"]) < 2) and time.monotonic() < deadline:
        time.sleep(0.1)
        history = client.get("/fleet/history", params={"since": 60, "bucket": 5}).json()
    assert set(history) == {"now", "window_s", "bucket_s", "pools", "workers", "latency", "traffic", "events"}
    assert (history["window_s"], history["bucket_s"]) == (60.0, 5.0)
    assert set(history["pools"]) == {"prefill", "decode"} and set(history["workers"]) == {"prefill-0", "decode-0"}
    assert all(len(series) == 12 for series in (*history["pools"].values(), *history["workers"].values()))
    assert history["traffic"]["requests"] == 2 and history["traffic"]["ttft_s"]["p50"] is not None
    assert {(e["kind"], e["worker"]) for e in history["events"]} >= {("start", "prefill-0"), ("start", "decode-0")}
    default = client.get("/fleet/history").json()
    assert (default["window_s"], default["bucket_s"]) == (300.0, 5.0)


@pytest.mark.parametrize("query, message", [
    ("since=0", "since: Input should be greater than 0"),
    ("since=-5", "since: Input should be greater than 0"),
    ("since=604801", "since: Input should be less than or equal to 604800"),
    ("since=soon", "since: Input should be a valid number"),
    ("since=nan", "since: Input should be"),
    ("bucket=0.5", "bucket: Input should be greater than or equal to 1"),
    ("since=10&bucket=20", "bucket (20 s) must not be longer than since (10 s)"),
    ("since=604800&bucket=1", "at most 20000: use a larger bucket"),
])
def test_bad_history_queries_get_400(client: TestClient, query: str, message: str) -> None:
    response = client.get(f"/fleet/history?{query}")
    assert response.status_code == 400 and message in response.json()["error"]["message"], response.text


def test_history_without_a_store_is_404(tiny_model_dir: Path, tmp_path: Path) -> None:
    with make_client(tiny_model_dir, tmp_path, store=False) as client:
        response = client.get("/fleet/history")
    assert response.status_code == 404
    assert response.json()["error"]["message"] == "this fleet keeps no metrics store, so it has no history"
