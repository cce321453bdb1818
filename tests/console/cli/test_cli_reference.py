"""docs/cli.md is generated from the typer app (console/cli/reference.py): it is what the app generates now, every
command and sub-command has its `## fleetctl …` section (the README links to them), and a table cell holds one
line with its `|` escaped (GFM would otherwise split the row)."""

from pathlib import Path

import typer

from fleetctl.console.cli.app import app
from fleetctl.console.cli.reference import REGENERATE, cell, reference

DOCS = Path(__file__).resolve().parents[3] / "docs" / "cli.md"


def test_docs_cli_md_is_what_the_app_generates() -> None:
    assert DOCS.read_text() == reference(), f"docs/cli.md is stale: regenerate it with `{REGENERATE}`"


def test_every_command_and_sub_command_has_its_section() -> None:
    text = reference()
    root = typer.main.get_command(app)
    for name, command in root.commands.items():
        assert f"\n## fleetctl {name}\n" in text
        for sub in getattr(command, "commands", {}):
            assert f"\n## fleetctl {name} {sub}\n" in text
    assert "[`fleetctl models pull`](#fleetctl-models-pull)" in text


def test_a_command_s_section_lists_each_of_its_options() -> None:
    serve = reference().split("\n## fleetctl serve\n")[1].split("\n## ")[0]
    for param in typer.main.get_command(app).commands["serve"].params:
        assert f"| `{param.opts[0]}`" in serve, param.opts[0]
    assert "| `--compile`, `$FLEET_COMPILE` | `on` \\| `off` | `off` |" in serve


def test_a_cell_is_one_line_with_its_bars_escaped() -> None:
    assert cell("evict|write-through:\n  as soon as") == "evict\\|write-through: as soon as"
