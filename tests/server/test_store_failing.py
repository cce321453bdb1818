"""A metrics store whose disk fills while the fleet serves: no request fails or waits, `/fleet/status` (and
`fleetctl status`) say the store is failing and why, and once the disk has room again the rows kept meanwhile are
written. The fleet is real (controller, server on 127.0.0.1, store writer) over in-process fake workers, so the
writer's connection can be made to refuse writes where no tmpfs can be mounted (tests/support/volumes.py)."""

from collections.abc import Callable
from pathlib import Path

import httpx
from support.fake_fleet_server import fake_fleet
from support.fleet_harness import wait_until
from support.volumes import store_disk
from typer.testing import CliRunner

from fleetctl.console.cli.app import app
from fleetctl.store.db import open_db


def complete(url: str, model: str, count: int, offset: int = 0) -> list[int]:
    with httpx.Client(timeout=60) as client:
        return [client.post(f"{url}/v1/completions", json={"model": model, "prompt": f"prompt {offset + n}",
                                                            "max_tokens": 4}).status_code for n in range(count)]


def store_status(url: str) -> dict:
    return httpx.get(f"{url}/fleet/status", timeout=10).json()["store"]


def rows(path: Path, table: str) -> int:
    db = open_db(path)
    try:
        return db[table].count
    finally:
        db.close()


def eventually(condition: Callable[[], object]) -> None:
    assert wait_until(condition, 30), "not within 30 s"


def test_a_full_store_disk_fails_no_request_and_status_says_so(tiny_model_dir: Path, tmp_path: Path) -> None:
    model = tiny_model_dir.name
    with store_disk(tmp_path) as disk, fake_fleet(tiny_model_dir, tmp_path, disk.store) as (url, fleet):
        assert complete(url, model, 4) == [200] * 4
        eventually(lambda: rows(disk.store, "requests") == 4)
        assert store_status(url) == {"path": str(disk.store), "failing": False, "problem": None, "error": None,
                                     "failing_since": None, "kept_rows": 0}
        disk.fill(fleet.state.recorder.writer)
        assert complete(url, model, 8, offset=4) == [200] * 8  # served while the store refuses every write
        eventually(lambda: store_status(url)["failing"])
        failing = store_status(url)
        assert failing["problem"] == "disk full"
        assert f"the store {disk.store} cannot be written: its disk is full" in failing["error"]
        assert failing["kept_rows"] >= 8 and failing["failing_since"] is not None
        said = CliRunner().invoke(app, ["status", "--url", url])
        assert said.exit_code == 0 and "metrics store FAILING: the store" in said.stdout
        disk.free()
        eventually(lambda: not store_status(url)["failing"])
        eventually(lambda: rows(disk.store, "requests") == 12)  # the kept rows, written once there was room
