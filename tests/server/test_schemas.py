"""The `/fleet/*` contract is typed: every route's 2xx response has a JSON schema in `/openapi.json`, an
operation's body round-trips through `OperationInfo` as the result model it was built from, and a
checkpoint's result carries `path` (the documented `checkpoint --json` field) beside `checkpoint`."""

import time
from pathlib import Path

from fastapi.testclient import TestClient
from support.fake_workers import FakeLauncher

from fleetctl.engine.api.operation_results import (
    CheckpointResult,
    DrainResult,
    LiveMigrateResult,
    MoveResult,
    MoveStageDone,
    RebalanceResult,
    RestartResult,
    RestoreResult,
    ResumeResult,
    RoleChanged,
    SessionMoved,
    StartResult,
    StopResult,
)
from fleetctl.engine.api.operations import OperationInfo, OpKind, OpState
from fleetctl.engine.api.stages import STAGES, progress
from fleetctl.engine.fleet.controller import Fleet
from fleetctl.engine.fleet.fleet_config import FleetConfig
from fleetctl.engine.fleet.ops.record import Operation
from fleetctl.engine.server.app import create_app

TOKEN = "test-admin-token"
RESULTS = [
    CheckpointResult(worker="decode-0", path="/c/decode-0-x", checkpoint="/c/decode-0-x", sessions=2, bytes=10,
                     seconds=0.5),
    RestoreResult(kind="restore", worker="decode-0", from_="cpu:1", to="cpu:2", mode="cold-start", reason="dtype",
                  sessions=2, bytes=10, downtime_s=0.3, checkpoint="/c/decode-0-x", restore_s=0.2),
    RestoreResult(kind="migrate", worker="prefill-0", from_="cpu:0", to="cpu:3", mode="restored", reason=None,
                  sessions=1, bytes=5, downtime_s=0.3, checkpoint="/c/prefill-0-x", restore_s=0.2, checkpoint_s=0.1),
    LiveMigrateResult(worker="decode-0", from_="cpu:1", to="cpu:2", sessions=1, bytes=7, downtime_s=0.004,
                      moves=[SessionMoved(request="req-1", downtime_s=0.004, resumed_at=1.0)], seconds=1.0),
    MoveResult(request="req-1", from_="decode-0", to="decode-1", bytes=7, downtime_s=None, resumed_at=None,
               stages=[MoveStageDone(stage="reserve", blocks=2, bytes=0, seconds=0.001)]),
    StartResult(worker="decode-2", role="decode", device="cpu:3", pid=42, seconds=1.5),
    DrainResult(worker="decode-0", sessions_finished=3, seconds=2.0),
    DrainResult(worker="decode-0", sessions_finished=1, sessions_moved=2, seconds=2.0),
    ResumeResult(worker="decode-0", cancelled_operation="op-1"),
    StopResult(worker="decode-0", sessions_finished=1, sessions_moved=2, seconds=2.0),
    RestartResult(worker="decode-0", device="cpu:1", pid=43, attempt=2, backoff_s=1.0),
    RebalanceResult(split="2:1", from_="1:2", evacuation="move", seconds=9.0, moves=[RoleChanged(
        worker="decode-0", device="cpu:1", from_="decode", to="prefill", sessions=2, new_worker="prefill-1",
        sessions_finished=0, sessions_moved=2, seconds=4.0)]),
]


def make_client(model_dir: Path, tmp_path: Path) -> TestClient:
    (tmp_path / "shm").mkdir(exist_ok=True)
    config = FleetConfig(model_dir, prefill=1, decode=1, devices=("cpu:0", "cpu:1"), shm_dir=tmp_path / "shm",
                         store_path=tmp_path / "fleet.db")
    app = create_app(Fleet(config, launcher=FakeLauncher(tmp_path / "shm")), TOKEN)
    return TestClient(app, base_url="http://127.0.0.1:8700", headers={"Authorization": f"Bearer {TOKEN}"})


def _resolve(schema: dict, spec: dict) -> dict:
    while "$ref" in schema:
        name = schema["$ref"].rsplit("/", 1)[-1]
        schema = spec["components"]["schemas"][name]
    return schema


def test_every_fleet_route_has_a_response_schema(tiny_model_dir: Path, tmp_path: Path) -> None:
    spec = make_client(tiny_model_dir, tmp_path).get("/openapi.json").json()
    routes = [(path, method, op) for path, methods in spec["paths"].items() if path.startswith("/fleet/")
              for method, op in methods.items()]
    assert len(routes) >= 17
    for path, method, op in routes:
        success = {code: r for code, r in op["responses"].items() if code.startswith("2")}
        assert success, f"{method} {path}: no 2xx response"
        for code, response in success.items():
            schema = response.get("content", {}).get("application/json", {}).get("schema", {})
            resolved = _resolve(schema, spec)
            assert resolved and resolved != {"type": "object"}, f"{method.upper()} {path} {code}: no schema"
            assert any(key in resolved for key in ("properties", "anyOf", "oneOf")), f"{method} {path} {code}"


def test_operation_bodies_parse_back_to_their_result_model() -> None:
    for result in RESULTS:
        op = Operation(OpKind(result.kind), "decode-0", state=OpState.DONE, result=result)
        body = op.info().model_dump(mode="json")
        parsed = OperationInfo.model_validate(body)
        assert type(parsed.result) is type(result), body["result"]
        assert parsed.result == result
        assert parsed.model_dump(mode="json") == body and "kind" not in body["result"]


def test_stages_are_declared_once_per_kind_and_give_progress() -> None:
    assert set(STAGES) == set(OpKind)
    for kind, paths in STAGES.items():
        for stages in paths:
            names = [s.value for s in stages]
            assert names[0] == "queued" and names[-1] == "done", kind
            assert [progress(kind, name) for name in names] == sorted(progress(kind, name) for name in names)
    assert progress(OpKind.CHECKPOINT, "done") == 1.0
    assert progress(OpKind.MIGRATE, "switching over") is not None
    assert progress(OpKind.START, "no such stage") is None


def test_a_checkpoint_result_has_path_beside_checkpoint(tiny_model_dir: Path, tmp_path: Path) -> None:
    with make_client(tiny_model_dir, tmp_path) as client:
        response = client.post("/fleet/workers/decode-0/checkpoint", json={"hold_s": 30})
        assert response.status_code == 202, response.text
        op = response.json()
        deadline = time.monotonic() + 20
        while op["state"] == "running" and time.monotonic() < deadline:
            time.sleep(0.02)
            op = client.get(f"/fleet/operations/{op['id']}").json()
        assert op["state"] == "done", op
        result = op["result"]
        assert {"worker", "path", "sessions", "bytes", "seconds"} <= result.keys()  # DESIGN §2's `checkpoint --json`
        assert result["path"] == result["checkpoint"] and Path(result["path"]).is_dir()
        assert op["step"] == "done" and op["progress"] == 1.0
