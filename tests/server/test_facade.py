"""The server talks to the fleet through the `Fleet` controller's own methods only: no route reaches into
its parts (lifecycle, checkpoints, restores, migrations, moves, operations, rebalancer) or its shared state."""

import ast
from pathlib import Path

SERVER = Path(__file__).resolve().parents[2] / "engine" / "server"
PARTS = {"lifecycle", "checkpoints", "restores", "migrations", "moves", "operations", "rebalancer", "state"}


def reached_parts(source: str) -> list[str]:
    """`fleet.<part>` and `self.fleet.<part>` in `source`."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Attribute) or node.attr not in PARTS:
            continue
        owner = node.value
        if (isinstance(owner, ast.Name) and owner.id == "fleet") or (
                isinstance(owner, ast.Attribute) and owner.attr == "fleet"):
            found.append(f"line {node.lineno}: fleet.{node.attr}")
    return sorted(found)


def test_the_server_uses_the_fleet_facade_only() -> None:
    assert reached_parts("fleet.lifecycle.start('decode', 'cpu:1'); self.fleet.state.closing") == [
        "line 1: fleet.lifecycle", "line 1: fleet.state"]
    for path in sorted(SERVER.glob("*.py")):
        assert reached_parts(path.read_text()) == [], path.name
