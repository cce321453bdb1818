"""GET /fleet/plan and POST /fleet/rebalance over HTTP (FastAPI's TestClient) on a fleet of fake workers whose
store holds ten minutes of rag-like traffic measured on its devices (tests/support/synthetic_fleet.py)."""

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from support.fake_workers import FakeLauncher
from support.synthetic_fleet import workload, write_store

from fleetctl.engine.fleet.controller import Fleet
from fleetctl.engine.fleet.fleet_config import FleetConfig
from fleetctl.engine.server.app import create_app

TOKEN = "test-admin-token"


@pytest.fixture
def client(tiny_model_dir: Path, tmp_path: Path) -> Iterator[TestClient]:
    (tmp_path / "shm").mkdir()
    store = tmp_path / "fleet.db"
    write_store(store, workload("rag", 60, 1.5), t0=time.time() - 600)
    config = FleetConfig(tiny_model_dir, prefill=1, decode=2, devices=("cpu:0", "cpu:1", "cpu:2"), store_path=store,
                         shm_dir=tmp_path / "shm")
    app = create_app(Fleet(config, launcher=FakeLauncher(tmp_path / "shm")), TOKEN)
    with TestClient(app, base_url="http://127.0.0.1:8700", headers={"Authorization": f"Bearer {TOKEN}"}) as client:
        yield client


def test_plan_for_this_fleet(client: TestClient) -> None:
    response = client.get("/fleet/plan", params={"since": "20m", "slo_ttft": "2s", "slo_tpot": "200ms"})
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["current"] == {"prefill": 1, "decode": 2, "mixed": 0, "layout": "disaggregated",
                               "devices": 3}
    assert body["devices"] == ["cpu:0", "cpu:1", "cpu:2"] and body["window_s"] == 1200
    assert body["best_split"]["prefill"] == 2 and body["gain_pct"] > 10
    assert {(c["prefill"], c["decode"], c["mixed"]) for c in body["candidates"]} == {(1, 2, 0), (2, 1, 0), (0, 0, 3)}
    what_if = client.get("/fleet/plan", params={"since": "20m", "devices": "4xA100"}).json()
    assert what_if["what_if"] == {"gpu": "A100", "count": 4} and len(what_if["candidates"]) == 4


@pytest.mark.parametrize(("params", "message"), [
    ({"since": "forever"}, "bad --since 'forever': use e.g. 90s, 10m, 2h, 1d"),
    ({"slo_ttft": "2x"}, "bad --slo-ttft '2x': use e.g. 2s, 200ms or 0.2"),
    ({"slo_tpot": "0"}, "bad --slo-tpot '0'"),
    ({"devices": "9xB200"}, "unknown GPU 'B200'"),
    ({"since": "5s"}, "no requests to replay: the last 5s of the store hold none"),
])
def test_bad_plan_queries_get_one_clear_error(client: TestClient, params: dict, message: str) -> None:
    response = client.get("/fleet/plan", params=params)
    assert response.status_code == 400
    assert message in response.json()["error"]["message"]


def test_rebalance_dry_run_then_apply(client: TestClient) -> None:
    dry = client.post("/fleet/rebalance", json={"split": "2:1"})
    assert dry.status_code == 200, dry.text
    assert dry.json() == {"split": "2:1", "current": "1:2", "force": False, "evacuation": "move",
                          "moves": [{"worker": "decode-0", "device": "cpu:1", "from": "decode", "to": "prefill",
                                     "sessions": 0}], "via": "switch", "starts": [], "stops": []}
    started = client.post("/fleet/rebalance", json={"split": "2:1", "apply": True})
    assert started.status_code == 202 and started.json()["kind"] == "rebalance"
    op = started.json()
    assert started.headers["location"] == f"/fleet/operations/{op['id']}"
    deadline = time.monotonic() + 20
    while op["state"] == "running" and time.monotonic() < deadline:
        time.sleep(0.02)
        op = client.get(f"/fleet/operations/{op['id']}").json()
    assert op["state"] == "done", op
    assert op["result"]["from"] == "1:2" and op["result"]["moves"][0]["new_worker"] == "prefill-1"
    workers = {w["id"]: (w["role"], w["state"], w["was"]) for w in client.get("/fleet/workers").json()["workers"]}
    assert "decode-0" not in workers and workers["prefill-1"] == ("prefill", "running", "decode-0")  # switched
    again = client.post("/fleet/rebalance", json={"split": "2:1", "apply": True})
    assert again.status_code == 409 and again.json()["error"]["message"] == "the fleet is already at split 2:1"


@pytest.mark.parametrize(("body", "status", "message"), [
    ({"split": "2:2"}, 400, "split 2:2 needs 4 devices and the fleet runs 3 (cpu:0, cpu:1, cpu:2); it has no free one"),
    ({"split": "two"}, 400, "bad split 'two': use PREFILL:DECODE, e.g. 2:1"),
    ({"split": "3:0", "apply": True}, 400, "leaves a role empty"),
    ({}, 400, "split: Field required"),
    ({"split": "2:1", "force": "maybe"}, 400, "force"),
])
def test_bad_rebalances_get_one_clear_error(client: TestClient, body: dict, status: int, message: str) -> None:
    response = client.post("/fleet/rebalance", json=body)
    assert response.status_code == status
    assert message in response.json()["error"]["message"]


def test_rebalance_needs_the_admin_token(client: TestClient) -> None:
    response = client.post("/fleet/rebalance", json={"split": "2:1"}, headers={"Authorization": ""})
    assert response.status_code == 401
