from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from support.fake_workers import FakeLauncher

from fleetctl.engine.fleet.controller import Fleet
from fleetctl.engine.fleet.fleet_config import FleetConfig
from fleetctl.engine.server.app import create_app


@pytest.fixture(scope="module")
def fake_client(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[TestClient]:
    """The real app (FastAPI's TestClient) on a fleet of fake workers (scripted tokens, no model): for what the
    server decides, fast."""
    shm = tmp_path_factory.mktemp("shm")
    fleet = Fleet(FleetConfig(tiny_model_dir, prefill=1, decode=1, devices=("cpu:0", "cpu:1"), shm_dir=shm),
                  launcher=FakeLauncher(shm))
    with TestClient(create_app(fleet, "token"), base_url="http://127.0.0.1:8700") as test_client:
        yield test_client
