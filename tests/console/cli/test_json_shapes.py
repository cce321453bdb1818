"""Every `--json` of a fleet-backed command is one object that is its schema model (`engine/api/`)
exactly — parsing it and dumping it again gives the same JSON, so no field was lost or renamed — and carries
the field names DESIGN §2 documents. Against a real HTTP server in this process on fake workers
(support/fake_fleet_server.py); `move` (fakes refuse a live move) against a stub that answers one done move."""

import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from pydantic import BaseModel
from support.fake_fleet_server import fake_fleet_url
from support.synthetic_fleet import workload, write_store
from typer.testing import CliRunner

from fleetctl.console.cli.app import app
from fleetctl.engine.api.checkpoints import CheckpointList
from fleetctl.engine.api.operation_results import (
    CheckpointResult,
    DrainResult,
    LiveMigrateResult,
    MoveResult,
    MoveStageDone,
    RebalancePreview,
    RebalanceResult,
    RestoreResult,
    ResumeResult,
    StartResult,
    StopResult,
    SwitchResult,
)
from fleetctl.engine.api.operations import OperationInfo, OpKind, OpState
from fleetctl.engine.api.reports import FleetPlan
from fleetctl.engine.api.status import FleetStatus, WorkerList

# DESIGN §2's `--json` shapes (fields may be added, never renamed)
WORKER = {"id", "role", "device", "state", "pid", "sessions", "kv_usage", "busy", "mfu", "mbu"}
POOL = {"workers", "busy", "mfu", "mbu", "queue"}
CHECKPOINT = {"worker", "path", "sessions", "bytes", "seconds"}
MIGRATE = {"worker", "from", "to", "mode", "reason", "sessions", "bytes", "downtime_s", "checkpoint"}
PLAN = {"recommended", "current", "candidates", "reason"}
CANDIDATE = {"prefill", "decode", "goodput", "ttft_p90_s", "tpot_p90_s"}
SWITCH = {"worker", "was", "from", "to", "pid", "sessions_moved", "sessions_finished", "out_of_service_s", "seconds"}


def json_of(model: type[BaseModel], *args: str) -> dict:
    """`fleetctl ARGS --json`: one object on stdout that is `model` exactly."""
    result = CliRunner().invoke(app, [*args, "--json"])
    assert result.exit_code == 0, result.stderr
    body = json.loads(result.stdout)
    assert model.model_validate(body).model_dump(mode="json") == body
    return body


@pytest.fixture
def url(tiny_model_dir: Path, tmp_path: Path) -> Iterator[str]:
    with fake_fleet_url(tiny_model_dir, tmp_path) as served:
        yield served


def test_status_workers_and_the_pool_changes(url: str) -> None:
    status = json_of(FleetStatus, "status", "--url", url)
    assert {"model", "url", "workers", "pools"} <= set(status)
    assert all(set(w) >= WORKER for w in status["workers"]) and status["workers"]
    assert set(status["pools"]) == {"prefill", "decode"} and all(set(p) >= POOL for p in status["pools"].values())
    workers = json_of(WorkerList, "workers", "--url", url)
    assert [w["id"] for w in workers["workers"]] == [w["id"] for w in status["workers"]]

    started = json_of(StartResult, "start", "--role", "decode", "--device", "cpu:3", "--url", url)
    assert (started["worker"], started["device"]) == ("decode-2", "cpu:3")
    assert json_of(DrainResult, "drain", "decode-2", "--url", url)["sessions_finished"] == 0
    assert json_of(ResumeResult, "resume", "decode-2", "--url", url) == {"worker": "decode-2",
                                                                         "cancelled_operation": None}
    assert json_of(StopResult, "stop", "decode-2", "--url", url)["worker"] == "decode-2"
    switched = json_of(SwitchResult, "switch", "decode-1", "--role", "prefill", "--url", url)
    assert set(switched) >= SWITCH and (switched["worker"], switched["was"]) == ("prefill-1", "decode-1")


def test_checkpoint_restore_and_both_migrations(url: str) -> None:
    saved = json_of(CheckpointResult, "checkpoint", "decode-1", "--url", url)
    assert set(saved) >= CHECKPOINT and saved["path"] == saved["checkpoint"]
    listed = json_of(CheckpointList, "checkpoints", "--url", url)["checkpoints"]
    assert saved["path"] in [row["checkpoint"] for row in listed]  # $FLEET_HOME is the session's: others' too
    restored = json_of(RestoreResult, "restore", Path(saved["path"]).name, "--device", "cpu:4", "--url", url)
    assert set(restored) >= MIGRATE and (restored["worker"], restored["to"]) == ("decode-1", "cpu:4")

    live = json_of(LiveMigrateResult, "migrate", "decode-0", "--to", "cpu:5", "--url", url)
    assert set(live) >= MIGRATE and (live["mode"], live["from"], live["to"]) == ("live", "cpu:1", "cpu:5")
    via = json_of(RestoreResult, "migrate", "decode-0", "--to", "cpu:6", "--via", "checkpoint", "--url", url)
    assert set(via) >= MIGRATE and (via["from"], via["to"]) == ("cpu:5", "cpu:6")
    assert via["mode"] == "restored" and via["checkpoint_s"] >= 0


def test_rebalance_dry_run_and_apply(tiny_model_dir: Path, tmp_path: Path) -> None:
    with fake_fleet_url(tiny_model_dir, tmp_path) as url:
        preview = json_of(RebalancePreview, "rebalance", "--split", "2:1", "--url", url)
        assert (preview["current"], preview["split"]) == ("1:2", "2:1") and len(preview["moves"]) == 1
        applied = json_of(RebalanceResult, "rebalance", "--split", "2:1", "--apply", "--url", url)
        assert (applied["from"], applied["split"], applied["moves"][0]["worker"]) == ("1:2", "2:1", "decode-0")


def test_plan_from_a_store(tmp_path: Path) -> None:
    store = tmp_path / "fleet.db"
    write_store(store, workload("rag", 60, 1.5), t0=time.time() - 600)
    plan = json_of(FleetPlan, "plan", "--store", str(store), "--since", "1h", "--devices", "cpu:0,cpu:1,cpu:2")
    assert set(plan) >= PLAN and {"prefill", "decode"} <= set(plan["recommended"])
    assert plan["current"] is None or {"prefill", "decode"} <= set(plan["current"])
    assert plan["candidates"] and all(set(c) >= CANDIDATE for c in plan["candidates"])


MOVED = OperationInfo(
    id="op-7", kind=OpKind.MOVE, worker="decode-0", device=None, state=OpState.DONE, step="done", stage="done",
    progress=1.0, started=0.0, error=None, writer_pid=None, destination_pid=None,
    result=MoveResult(request="req-1", from_="decode-0", to="decode-1", bytes=4096, downtime_s=0.002, resumed_at=1.0,
                      stages=[MoveStageDone(stage="pre-copy", blocks=3, bytes=4096, seconds=0.01)]))


class MovingFleet(BaseHTTPRequestHandler):
    def do_POST(self) -> None:
        body = MOVED.model_dump_json().encode()
        self.send_response(202 if self.path == "/fleet/requests/req-1/move" else 404)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *_: object) -> None:
        pass


def test_move() -> None:
    server = ThreadingHTTPServer(("127.0.0.1", 0), MovingFleet)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        moved = json_of(MoveResult, "move", "req-1", "--to", "decode-1", "--url", f"127.0.0.1:{server.server_port}")
    finally:
        server.shutdown()
    assert moved == MOVED.result.model_dump(mode="json")
    assert {"request", "from", "to", "stages", "bytes", "downtime_s"} <= set(moved)
