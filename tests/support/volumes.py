"""Volumes that refuse writes, for the tests of what fleetctl says then: a real tmpfs (full, or read-only) where
this machine lets the tests mount one, else nothing mounted and the caller makes the same error appear."""

import sqlite3
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from fleetctl.store.writer import MetricsWriter


@contextmanager
def tmpfs(folder: Path, size: str, read_only: bool = False) -> Iterator[bool]:
    """Mount a tmpfs of `size` on `folder` (created) for the block; yields whether it could be mounted."""
    folder.mkdir(parents=True, exist_ok=True)
    options = f"size={size}" + (",ro" if read_only else "")
    try:
        mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(folder)],
                                 capture_output=True).returncode == 0
    except FileNotFoundError:  # no mount(8) here
        mounted = False
    try:
        yield mounted
    finally:
        if mounted:
            subprocess.run(["umount", "-l", str(folder)], check=True)


def fill(folder: Path) -> Path:
    """Write a file on `folder`'s volume until the volume is full; returns it (unlink it to free the space)."""
    filler = folder / "filler"
    with filler.open("wb") as out:
        try:
            while True:
                out.write(b"\0" * 65536)
                out.flush()
        except OSError:
            pass
    return filler


class StoreDisk:
    """The disk under a metrics store, which `fill` makes refuse the writer's writes and `free` gives room again:
    really (a tmpfs), or where nothing could be mounted by the writer's connection refusing them as sqlite does on
    a full disk ("database or disk is full")."""

    def __init__(self, folder: Path, mounted: bool) -> None:
        self.folder, self.mounted = folder, mounted
        self.full = False

    @property
    def store(self) -> Path:
        return self.folder / "fleet.db"

    def fill(self, writer: MetricsWriter) -> None:
        self.full = True
        if self.mounted:
            fill(self.folder)
            return
        real = writer._db.atomic

        def refused(*args: object, **kwargs: object):
            if self.full:
                raise sqlite3.OperationalError("database or disk is full")
            return real(*args, **kwargs)

        writer._db.atomic = refused  # type: ignore[method-assign]

    def free(self) -> None:
        self.full = False
        (self.folder / "filler").unlink(missing_ok=True)


@contextmanager
def store_disk(tmp_path: Path) -> Iterator[StoreDisk]:
    with tmpfs(tmp_path / "volume", "2m") as mounted:
        yield StoreDisk(tmp_path / "volume", mounted)
