"""A store file that cannot be used, said in one line: which file, what is wrong with it, what to do. Only the
standard library here, so that the command line can catch these without importing the store."""

import errno
import os
import shutil
import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from enum import Enum
from pathlib import Path

from fleetctl.errors import FleetctlError

ELSEWHERE = "or give another file with --store"


class StoreProblem(Enum):
    NOT_A_DATABASE = "not a database"
    NEWER_SCHEMA = "newer schema"
    READ_ONLY = "read-only"
    DISK_FULL = "disk full"
    IO_ERROR = "I/O error"
    UNOPENABLE = "cannot be opened"


class StoreFileError(FleetctlError):
    def __init__(self, path: Path, problem: StoreProblem, message: str) -> None:
        super().__init__(message)
        self.path, self.problem = path, problem


class StoreVersionError(StoreFileError):
    """The file was written by a newer fleetctl than this one."""

    def __init__(self, path: Path, found: int, readable: int) -> None:
        path = path.absolute()
        super().__init__(path, StoreProblem.NEWER_SCHEMA,
                         f"the store {path} was written by a newer fleetctl (schema version {found}; this one reads "
                         f"up to {readable}): upgrade fleetctl, {ELSEWHERE}")


def _free(path: Path) -> str:
    folder = next((p for p in (path, *path.parents) if p.exists()), Path("/"))
    return f"{shutil.disk_usage(folder).free / 2**20:.1f} MiB free"


def diagnose(path: Path, exc: sqlite3.Error | OSError) -> StoreFileError:
    """What `exc`, raised opening or writing the store at `path`, means to the person running fleetctl."""
    text, path = str(exc).lower(), path.absolute()
    if (isinstance(exc, OSError) and exc.errno == errno.ENOSPC) or "disk is full" in text:
        return StoreFileError(path, StoreProblem.DISK_FULL, f"the store {path} cannot be written: its disk is full "
                                                            f"({_free(path)}): free some space, {ELSEWHERE}")
    unwritable = "unable to open" in text and not os.access(path.parent, os.W_OK)  # WAL needs files beside it
    if (isinstance(exc, OSError) and exc.errno in (errno.EROFS, errno.EACCES, errno.EPERM)) or "readonly" in text \
            or unwritable:
        return StoreFileError(path, StoreProblem.READ_ONLY, f"the store {path} is read-only: make it (and its folder) "
                                                            f"writable, {ELSEWHERE}")
    if (isinstance(exc, OSError) and exc.errno == errno.EIO) or "i/o error" in text:
        return StoreFileError(path, StoreProblem.IO_ERROR, f"the store {path} cannot be written: its disk gives I/O "
                                                           f"errors ({exc}): check the disk, {ELSEWHERE}")
    if isinstance(exc, sqlite3.DatabaseError) and ("not a database" in text or "malformed" in text):
        return StoreFileError(path, StoreProblem.NOT_A_DATABASE,
                              f"the store {path} is not a fleetctl store (not an SQLite database, or a damaged one): "
                              f"move it aside (`fleetctl serve --store-reset` does), {ELSEWHERE}")
    return StoreFileError(path, StoreProblem.UNOPENABLE, f"the store {path} cannot be opened ({exc}): check the file "
                                                         f"and its folder, {ELSEWHERE}")


@contextmanager
def store_file_errors(path: Path) -> Iterator[None]:
    """Opening or writing the store at `path`: sqlite's and the OS's errors become StoreFileError."""
    try:
        yield
    except StoreFileError:
        raise
    except (sqlite3.Error, OSError) as exc:
        raise diagnose(path, exc) from exc
