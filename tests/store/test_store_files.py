"""A store file that cannot be used is one StoreFileError naming the file, what is wrong and what to do: not a
database, a newer schema, a read-only volume, a full disk. The volumes are real tmpfs mounts where this machine
lets the tests mount them; elsewhere sqlite is made to raise the error such a volume gives."""

import sqlite3
from collections.abc import Iterator
from pathlib import Path

import pytest
from support.volumes import fill, tmpfs

from fleetctl.store import db as store_db
from fleetctl.store.db import move_aside, open_db
from fleetctl.store.errors import StoreFileError, StoreProblem
from fleetctl.store.records import SCHEMA_VERSION


@pytest.fixture
def volume(tmp_path: Path, request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A folder on a full (request.param "full") or read-only ("ro") volume."""
    folder = tmp_path / "volume"
    with tmpfs(folder, "64k", read_only=request.param == "ro") as mounted:
        if mounted:
            if request.param == "full":
                fill(folder)
            yield folder
            return
        message = {"full": "database or disk is full", "ro": "attempt to write a readonly database"}[request.param]

        def failing_connect(*args: object, **kwargs: object) -> sqlite3.Connection:
            raise sqlite3.OperationalError(message)

        monkeypatch.setattr(store_db.sqlite3, "connect", failing_connect)
        yield folder


def refusal(path: Path) -> StoreFileError:
    with pytest.raises(StoreFileError) as error:
        open_db(path)
    assert str(path.absolute()) in str(error.value)
    assert str(error.value).endswith("or give another file with --store")
    return error.value


def test_a_file_that_is_not_a_database(tmp_path: Path) -> None:
    path = tmp_path / "fleet.db"
    path.write_bytes(b"these bytes are no SQLite header" * 8)
    error = refusal(path)
    assert error.problem is StoreProblem.NOT_A_DATABASE and "--store-reset" in str(error)


def test_a_store_from_a_newer_fleetctl(tmp_path: Path) -> None:
    path = tmp_path / "fleet.db"
    conn = sqlite3.connect(path)
    conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 4}")
    conn.close()
    error = refusal(path)
    assert error.problem is StoreProblem.NEWER_SCHEMA
    assert f"schema version {SCHEMA_VERSION + 4}; this one reads up to {SCHEMA_VERSION}" in str(error)


@pytest.mark.parametrize("volume", ["full"], indirect=True)
def test_a_store_on_a_full_disk(volume: Path) -> None:
    error = refusal(volume / "fleet.db")
    assert error.problem is StoreProblem.DISK_FULL and "its disk is full" in str(error)


@pytest.mark.parametrize("volume", ["ro"], indirect=True)
def test_a_store_on_a_read_only_volume(volume: Path) -> None:
    error = refusal(volume / "fleet.db")
    assert error.problem is StoreProblem.READ_ONLY and "is read-only" in str(error)


def test_moving_a_store_aside_takes_its_wal_files_along(tmp_path: Path) -> None:
    path = tmp_path / "fleet.db"
    for suffix in ("", "-wal", "-shm"):
        Path(f"{path}{suffix}").write_bytes(suffix.encode() or b"garbage")
    aside = move_aside(path)
    assert aside.name.startswith("fleet.db.corrupt-") and not path.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(f"{aside.name}{s}" for s in ("", "-wal", "-shm"))
    assert aside.read_bytes() == b"garbage"
    open_db(path).close()  # a fresh store where the corrupt one was
