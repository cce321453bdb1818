"""A fleet of in-process fake workers (fake_workers.py) behind the real HTTP server, in this process, for the
CLI's tests (typer's CliRunner against a real `/fleet/*`): `fake_fleet_url` yields its URL."""

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import uvicorn

from fleetctl.engine.api.admin_token import load_or_create_admin_token
from fleetctl.engine.fleet.controller import Fleet
from fleetctl.engine.fleet.fleet_config import FleetConfig
from fleetctl.engine.server.app import create_app
from support.fake_workers import FakeLauncher
from support.fleet_harness import wait_until


@contextmanager
def fake_fleet_url(model_dir: Path, tmp_path: Path, store: Path | None = None) -> Iterator[str]:
    """Serve a fleet of fakes (prefill-0, decode-0, decode-1 on cpu:0-2; its metrics store `store`, if any) on
    127.0.0.1 (a free port) until the block ends."""
    with fake_fleet(model_dir, tmp_path, store) as (url, _):
        yield url


@contextmanager
def fake_fleet(model_dir: Path, tmp_path: Path, store: Path | None = None) -> Iterator[tuple[str, Fleet]]:
    """As `fake_fleet_url`, and the Fleet itself (its parts to look at or to break)."""
    shm = tmp_path / "shm"
    shm.mkdir(exist_ok=True)
    config = FleetConfig(model_dir, prefill=1, decode=2, devices=("cpu:0", "cpu:1", "cpu:2"), shm_dir=shm,
                         store_path=store)
    fleet = Fleet(config, launcher=FakeLauncher(shm))
    app = create_app(fleet, load_or_create_admin_token())  # the CLI reads the same token file
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    assert wait_until(lambda: server.started, 30)
    try:
        yield f"http://127.0.0.1:{server.servers[0].sockets[0].getsockname()[1]}", fleet
    finally:
        server.should_exit = True
        thread.join(30)
