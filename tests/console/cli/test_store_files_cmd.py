"""A store file that is not a database or is from a newer fleetctl: every command that reads or writes the store
(`serve`, `console`, `demo`, `classify`, `plan`, `devices`) says so in one line naming the file, exit 1, no
traceback; and `serve --store-reset` moves a corrupt store aside, says where, and serves on a fresh one."""

import sqlite3
from pathlib import Path

import httpx
import pytest
from support.fleet_harness import fleetctl

from fleetctl.console.loadgen.local_fleet import local_fleet
from fleetctl.store.db import open_db
from fleetctl.store.records import SCHEMA_VERSION

COMMANDS = {
    "classify": ["classify"],
    "plan": ["plan", "--devices", "cpu:0,cpu:1"],
    "devices": ["devices"],
    "demo": ["demo", "--headless", "--duration", "2"],
    "console": ["console"],  # no fleet answers: it would embed one, writing this store
}


def corrupt_store(folder: Path) -> Path:
    path = folder / "fleet.db"
    path.write_bytes(b"not an sqlite file, just bytes " * 16)
    return path


def newer_store(folder: Path) -> Path:
    path = folder / "fleet.db"
    conn = sqlite3.connect(path)
    conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    conn.close()
    return path


@pytest.mark.parametrize("make", [corrupt_store, newer_store], ids=["not-a-database", "newer-schema"])
@pytest.mark.parametrize("command", COMMANDS)
def test_every_command_says_what_is_wrong_with_the_store(tmp_path: Path, command: str, make) -> None:
    path = make(tmp_path)
    result = fleetctl(*COMMANDS[command], "--store", str(path), env={"FLEET_URL": ""}, timeout=120)
    assert result.returncode == 1, result.stderr
    [line] = result.stderr.splitlines()
    assert line.startswith("fleetctl: error: ") and f"the store {path}" in line, line
    assert ("is not a fleetctl store" if make is corrupt_store else "was written by a newer fleetctl") in line


def test_serve_refuses_a_corrupt_store_before_starting_workers(tmp_path: Path, tiny_model_dir: Path) -> None:
    path = corrupt_store(tmp_path)
    result = fleetctl("serve", "--model", str(tiny_model_dir), "--port", "0", "--store", str(path), timeout=120)
    assert result.returncode == 1
    assert result.stderr.splitlines() == [
        f"fleetctl: error: the store {path} is not a fleetctl store (not an SQLite database, or a damaged one): "
        f"move it aside (`fleetctl serve --store-reset` does), or give another file with --store"]
    assert path.read_bytes().startswith(b"not an sqlite file")  # left as it was


@pytest.mark.fleet
def test_serve_store_reset_moves_a_corrupt_store_aside_and_serves(tmp_path: Path, tiny_model_dir: Path) -> None:
    path = corrupt_store(tmp_path)
    with local_fleet(tiny_model_dir, "--colocated", "1", "--devices", "cpu:0", "--store", str(path),
                     "--store-reset") as url:
        assert httpx.get(f"{url}/health", timeout=10).status_code == 200
    [aside] = tmp_path.glob("fleet.db.corrupt-*")
    assert aside.read_bytes().startswith(b"not an sqlite file")
    db = open_db(path)  # the fresh store the fleet wrote
    assert db["workers"].count >= 1
    db.close()
