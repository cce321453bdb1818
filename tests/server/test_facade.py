"""The server talks to the fleet through its façade only: every `fleet.<name>` the server reads is one that
`FleetFacade` declares (none of the controller's parts — its views, stats, config, admission, tokenizer, state),
the controller implements every declared name with the declared signature, the server imports no part of the
fleet, and the controller's record of a request (`TrackedRequest`) stays inside engine/fleet."""

import ast
import inspect
from pathlib import Path

from support.fake_workers import FakeLauncher

from fleetctl.engine.fleet.controller import Fleet
from fleetctl.engine.fleet.facade import FleetFacade
from fleetctl.engine.fleet.fleet_config import FleetConfig

ROOT = Path(__file__).resolve().parents[2]
SERVER = ROOT / "engine" / "server"
DECLARED = {name for name in dir(FleetFacade) if not name.startswith("_")} | set(FleetFacade.__annotations__)
# what the server may import of engine/fleet: the façade, the handle and its events, the values the façade's
# answers are made of, the fleet's errors (to report a start that failed), the shutdown's budget
SERVER_MAY_IMPORT = {"facade", "generation", "request", "status_view", "errors", "logs", "shutdown_budget"}


def fleet_reads(source: str) -> list[str]:
    """Every `fleet.<name>` and `self.fleet.<name>` in `source`, as "line N: fleet.<name>"."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Attribute):
            continue
        owner = node.value
        if (isinstance(owner, ast.Name) and owner.id == "fleet") or (
                isinstance(owner, ast.Attribute) and owner.attr == "fleet"):
            found.append(f"line {node.lineno}: fleet.{node.attr}")
    return found


def undeclared(source: str) -> list[str]:
    return [read for read in fleet_reads(source) if read.rsplit(".", 1)[1] not in DECLARED]


def test_the_server_reads_only_what_the_facade_declares() -> None:
    assert undeclared("fleet.stats.registry; self.fleet.state.closing; fleet.status(); fleet.model_name") == [
        "line 1: fleet.stats", "line 1: fleet.state"]
    assert {"status", "generate", "model_name", "in_flight"} <= DECLARED and not DECLARED & {"views", "stats"}
    reads = 0
    for path in sorted(SERVER.glob("*.py")):
        source = path.read_text()
        assert undeclared(source) == [], path.name
        reads += len(fleet_reads(source))
    assert reads > 30  # the check sees the routes' reads


def test_the_controller_is_the_facade(tiny_model_dir: Path, tmp_path: Path) -> None:
    config = FleetConfig(tiny_model_dir, prefill=1, decode=1, devices=("cpu:0", "cpu:1"), shm_dir=tmp_path)
    assert isinstance(Fleet(config, launcher=FakeLauncher(tmp_path)), FleetFacade)
    for name in DECLARED - set(FleetFacade.__annotations__):
        declared, implemented = getattr(FleetFacade, name), getattr(Fleet, name)
        if isinstance(declared, property):
            assert isinstance(implemented, property), name
            continue
        assert inspect.iscoroutinefunction(declared) == inspect.iscoroutinefunction(implemented), name
        params = [(p.name, p.kind, p.default is p.empty) for p in inspect.signature(declared).parameters.values()]
        assert params == [(p.name, p.kind, p.default is p.empty)
                          for p in inspect.signature(implemented).parameters.values()], name


def imports_of(path: Path) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            found |= {node.module} | {f"{node.module}.{alias.name}" for alias in node.names}
        elif isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
    return found


def test_the_server_imports_no_part_of_the_fleet() -> None:
    prefix = "fleetctl.engine.fleet."
    for path in sorted(SERVER.glob("*.py")):
        modules = {name.removeprefix(prefix).split(".")[0] for name in imports_of(path) if name.startswith(prefix)}
        assert modules <= SERVER_MAY_IMPORT, (path.name, modules - SERVER_MAY_IMPORT)


def test_the_request_record_stays_inside_the_fleet() -> None:
    fleet = ROOT / "engine" / "fleet"
    outside = [path for folder in ("engine", "console") for path in (ROOT / folder).rglob("*.py")
               if fleet not in path.parents]
    for path in outside:
        names = {node.id for node in ast.walk(ast.parse(path.read_text())) if isinstance(node, ast.Name)}
        assert "TrackedRequest" not in names and not any(
            name.endswith(".TrackedRequest") for name in imports_of(path)), path
