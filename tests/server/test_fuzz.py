"""Fuzzing the HTTP API: schemathesis generates requests from the app's own OpenAPI schema, valid and
invalid, for every /v1/* and /fleet/* operation, against a fleet of fake workers (in process, over ASGI).
No request may get a 5xx, and the fleet must still serve afterwards. About a minute."""

import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis.errors import Unsatisfiable
from support.fake_workers import FakeLauncher

from fleetctl.engine.fleet.controller import Fleet
from fleetctl.engine.fleet.fleet_config import FleetConfig
from fleetctl.engine.server.app import create_app

schemathesis = pytest.importorskip("schemathesis", reason="schemathesis is a dev extra (pip install -e '.[dev]')")
from schemathesis.core.result import Ok  # noqa: E402
from schemathesis.generation.modes import GenerationMode  # noqa: E402
from schemathesis.python import asgi  # noqa: E402

pytestmark = pytest.mark.slow  # about a minute: `make test` runs it, `make test-fast` does not
TOKEN = "fuzz-admin-token"
BASE = "http://127.0.0.1:8700"  # the Host the server's guard accepts on loopback
EXAMPLES = 150  # per operation and mode: about a minute here


def test_no_generated_request_gets_a_server_error(tiny_model_dir: Path, tmp_path: Path) -> None:
    (tmp_path / "shm").mkdir()
    config = FleetConfig(tiny_model_dir, prefill=1, decode=2, devices=("cpu:0", "cpu:1", "cpu:2"),
                         store_path=tmp_path / "fleet.db", shm_dir=tmp_path / "shm")
    app = create_app(Fleet(config, launcher=FakeLauncher(tmp_path / "shm")), TOKEN)
    schema = schemathesis.openapi.from_dict(app.openapi()).include(path_regex=r"^/(v1|fleet)/")
    schema.app = app
    headers = {"Authorization": f"Bearer {TOKEN}"}
    seen: list[tuple[str, int]] = []
    started = time.monotonic()
    try:
        with asgi.get_client(app) as client:  # starts the app's lifespan (the fleet) once, for every call
            for result in schema.get_all_operations():
                assert isinstance(result, Ok), result
                operation = result.ok()
                for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):

                    @given(case=operation.as_strategy(generation_mode=mode))
                    @settings(max_examples=EXAMPLES, deadline=None, database=None, derandomize=True,
                              suppress_health_check=list(HealthCheck))
                    def call(case) -> None:
                        response = case.call(session=client, base_url=BASE, headers=headers, timeout=30)
                        seen.append((case.operation.label, response.status_code))
                        assert response.status_code < 500, (case.operation.label, response.status_code,
                                                            response.text)

                    try:
                        call()
                    except Unsatisfiable:  # no invalid request exists (an operation without parameters)
                        assert mode is GenerationMode.NEGATIVE
            assert client.get(f"{BASE}/health").status_code == 200
            greedy = {"model": "tiny-llama0", "prompt": "hi", "max_tokens": 3, "temperature": 0}  # no early stop
            done = client.post(f"{BASE}/v1/completions", json=greedy, headers=headers)
            assert done.status_code == 200 and done.json()["usage"]["completion_tokens"] == 3
    finally:
        asgi.shutdown_lifespans()
    print(f"fuzz: {len(seen)} requests over {len({label for label, _ in seen})} operations in "
          f"{time.monotonic() - started:.0f} s; statuses {sorted({status for _, status in seen})}")
    assert len({label for label, _ in seen}) >= 15
