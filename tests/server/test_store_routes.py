"""GET /fleet/classify and GET /fleet/devices over HTTP (FastAPI's TestClient) on a fleet of fake workers whose
store holds ten minutes of rag-like traffic and two device peaks (tests/support/synthetic_fleet.py): each
answers what `classify` and `devices` read from that file, as its schema model exactly; a bad window is a 400
and a fleet without a store a 404, each with one clear message."""

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from support.fake_workers import FakeLauncher
from support.synthetic_fleet import T0, workload, write_device_peaks, write_store

from fleetctl.engine.api.reports import DevicePeaks, FleetClassification
from fleetctl.engine.fleet.controller import Fleet
from fleetctl.engine.fleet.fleet_config import FleetConfig
from fleetctl.engine.server.app import create_app
from fleetctl.store.classify import classify
from fleetctl.store.db import read_store

TOKEN = "test-admin-token"


def serve(model_dir: Path, tmp_path: Path, store: Path | None) -> TestClient:
    (tmp_path / "shm").mkdir(exist_ok=True)
    config = FleetConfig(model_dir, prefill=1, decode=1, devices=("cpu:0", "cpu:1"), shm_dir=tmp_path / "shm",
                         store_path=store)
    app = create_app(Fleet(config, launcher=FakeLauncher(tmp_path / "shm")), TOKEN)
    return TestClient(app, base_url="http://127.0.0.1:8700", headers={"Authorization": f"Bearer {TOKEN}"})


@pytest.fixture
def store(tmp_path: Path) -> Path:
    path = tmp_path / "fleet.db"
    write_store(path, workload("rag", 60, 1.5), t0=time.time() - 600)
    write_device_peaks(path)
    return path


@pytest.fixture
def client(tiny_model_dir: Path, tmp_path: Path, store: Path) -> Iterator[TestClient]:
    with serve(tiny_model_dir, tmp_path, store) as client:
        yield client


def test_classify_is_the_stores_classification(client: TestClient, store: Path) -> None:
    response = client.get("/fleet/classify", params={"since": "1h"})
    assert response.status_code == 200, response.text
    body = response.json()
    assert FleetClassification.model_validate(body).model_dump(mode="json") == body
    read = read_store(store, lambda db: classify(db, 3600.0)).as_json()
    assert body == FleetClassification.model_validate(read).model_dump(mode="json")
    assert (body["window_s"], body["requests"], body["prefill_share"]) == (3600.0, 60, 1.0)
    assert client.get("/fleet/classify").json()["window_s"] == 600.0  # `classify`'s default window, 10m


@pytest.mark.parametrize(("since", "message"), [
    ("forever", "bad --since 'forever': use e.g. 90s, 10m, 2h, 1d"),
    ("0", "bad --since '0'"),
])
def test_a_bad_classify_window_is_400(client: TestClient, since: str, message: str) -> None:
    response = client.get("/fleet/classify", params={"since": since})
    assert response.status_code == 400
    assert message in response.json()["error"]["message"]


def test_devices_are_the_stores_peaks(client: TestClient) -> None:
    response = client.get("/fleet/devices")
    assert response.status_code == 200, response.text
    body = response.json()
    assert DevicePeaks.model_validate(body).model_dump(mode="json") == body
    workers = [{"id": f"{role}-0", "role": role, "device": device, "device_name": "fake", "weights": "float32",
                "kv_dtype": "float32", "kv_tokens": 1024}
               for role, device in (("decode", "cpu:1"), ("prefill", "cpu:0"))]
    assert body.pop("workers") == workers  # each worker's weight and KV formats, as it reported when ready
    assert body == {"not_recalibrated": [], "devices": [
        {"identity": "cpu:Synthetic CPU:2threads:64MiB", "dtype": "float32", "kind": "cpu", "name": "Synthetic CPU",
         "peak_flops": 2.5e11, "peak_bytes_per_s": 2e10, "how": "calibrated", "measured_at": T0},
        {"identity": "cuda:NVIDIA H200", "dtype": "bfloat16", "kind": "cuda", "name": "NVIDIA H200",
         "peak_flops": 9.89e14, "peak_bytes_per_s": 4.8e12, "how": "spec-table", "measured_at": T0 + 60}]}


@pytest.mark.parametrize(("path", "message"), [
    ("/fleet/classify", "this fleet keeps no metrics store, so it has no traffic to classify"),
    ("/fleet/devices", "this fleet keeps no metrics store, so it has no device peaks"),
    ("/fleet/plan", "this fleet keeps no metrics store, so it has nothing to plan from"),
])
def test_a_fleet_without_a_store_is_404(tiny_model_dir: Path, tmp_path: Path, path: str, message: str) -> None:
    with serve(tiny_model_dir, tmp_path, None) as client:
        response = client.get(path)
    assert response.status_code == 404
    assert response.json()["error"]["message"] == message
