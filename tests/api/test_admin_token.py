"""The admin token: creation under $FLEET_HOME, and the environment override."""

import os
import stat
from pathlib import Path

import pytest

from fleetctl.engine.api.admin_token import admin_token_path, load_or_create_admin_token, read_admin_token


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("FLEET_HOME", str(tmp_path))
    monkeypatch.delenv("FLEET_ADMIN_TOKEN", raising=False)
    return tmp_path


def test_token_path_follows_fleet_home(home: Path) -> None:
    assert admin_token_path() == home / "admin-token"


def test_creates_a_private_token_file_and_reuses_it(home: Path) -> None:
    path = home / "admin-token"
    assert not path.exists()
    token = load_or_create_admin_token()
    assert len(token) >= 32
    assert token.strip() == token
    assert path.read_text() == token + "\n"
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert load_or_create_admin_token() == token
    assert read_admin_token() == token


def test_creates_fleet_home_if_missing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    home = tmp_path / "not" / "yet"
    monkeypatch.setenv("FLEET_HOME", str(home))
    monkeypatch.delenv("FLEET_ADMIN_TOKEN", raising=False)
    token = load_or_create_admin_token()
    assert (home / "admin-token").read_text().strip() == token


def test_each_home_gets_its_own_random_token(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("FLEET_ADMIN_TOKEN", raising=False)
    tokens = []
    for name in ("a", "b"):
        monkeypatch.setenv("FLEET_HOME", str(tmp_path / name))
        tokens.append(load_or_create_admin_token())
    assert tokens[0] != tokens[1]


def test_existing_token_file_is_read_stripped(home: Path) -> None:
    (home / "admin-token").write_text("  written-by-operator \n")
    assert load_or_create_admin_token() == "written-by-operator"
    assert read_admin_token() == "written-by-operator"


def test_environment_token_wins_and_writes_nothing(home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FLEET_ADMIN_TOKEN", "from-env")
    assert load_or_create_admin_token() == "from-env"
    assert read_admin_token() == "from-env"
    assert not (home / "admin-token").exists()


def test_environment_token_wins_over_the_file(home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (home / "admin-token").write_text("from-file\n")
    monkeypatch.setenv("FLEET_ADMIN_TOKEN", "from-env")
    assert load_or_create_admin_token() == "from-env"
    assert read_admin_token() == "from-env"


def test_empty_environment_token_is_ignored(home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FLEET_ADMIN_TOKEN", "")
    assert read_admin_token() is None
    token = load_or_create_admin_token()
    assert token and (home / "admin-token").exists()


def test_read_returns_none_when_nothing_is_configured(home: Path) -> None:
    assert read_admin_token() is None
    assert not (home / "admin-token").exists()  # reading never creates one
