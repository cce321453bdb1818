"""The repository's Markdown as a reader meets it on GitHub: every table renders whole, every relative link
and image leads somewhere, the README stays a front door (not a reference), and docs/http-api.md is what
scripts/gen_http_api_doc.py makes from the app's OpenAPI document."""

import importlib.util
import subprocess
from pathlib import Path
from urllib.parse import unquote, urlsplit

import typer
from support.markdown import heading_anchors, link_targets, table_rows
from typer.core import TyperGroup

from fleetctl.console.cli.app import app

CHECKOUT = Path(__file__).resolve().parents[1]
README_MAX_LINES = 150
COMMAND_LINE_MAX = 100  # the README's line for a command: a name and a phrase, the rest is in docs/cli.md
HTTP_API_SCRIPT = CHECKOUT / "scripts" / "gen_http_api_doc.py"


def tracked_markdown() -> list[Path]:
    """Every Markdown file git tracks, or would (untracked files not ignored: a new doc counts before its commit)."""
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard", "--", "*.md"],
                            cwd=CHECKOUT, capture_output=True, text=True, check=True).stdout
    files = [CHECKOUT / name for name in listed.split("\0") if name]
    assert CHECKOUT / "README.md" in files
    return files


def test_every_table_row_has_as_many_cells_as_its_header() -> None:
    wrong = [f"{path.relative_to(CHECKOUT)}:{row.line}: {row.cells} cells, its header {row.header_cells}"
             for path in tracked_markdown() for row in table_rows(path.read_text())
             if row.cells != row.header_cells]
    assert not wrong, "rows GitHub renders wrong (an unescaped | splits a cell; a wrapped row is a new row):\n" + \
        "\n".join(wrong)


def test_the_readme_is_a_front_door() -> None:
    lines = len((CHECKOUT / "README.md").read_text().splitlines())
    assert lines <= README_MAX_LINES, f"README.md has {lines} lines; the reference belongs in docs/"


def commands(group: TyperGroup, prefix: str = "fleetctl") -> list[str]:
    """Every command a user runs (`fleetctl serve`, `fleetctl models pull`): groups give their sub-commands."""
    found = []
    for name, command in group.commands.items():
        path = f"{prefix} {name}"
        found += commands(command, path) if isinstance(command, TyperGroup) else [path]
    return found


def test_the_readme_gives_every_command_one_short_line_into_the_cli_reference() -> None:
    lines = (CHECKOUT / "README.md").read_text().splitlines()
    every = commands(typer.main.get_command(app))  # type: ignore[arg-type]
    assert "fleetctl models pull" in every and "fleetctl serve" in every
    wrong = []
    for command in every:
        target = f"(docs/cli.md#{command.replace(' ', '-')})"
        mentions = [line for line in lines if target in line]
        if len(mentions) != 1 or len(mentions[0]) > COMMAND_LINE_MAX:
            wrong.append(f"{command}: {len(mentions)} lines link {target}, of {[len(m) for m in mentions]} chars")
    assert not wrong, f"one README line of <= {COMMAND_LINE_MAX} characters per command:\n" + "\n".join(wrong)


def test_every_relative_link_leads_to_a_file_and_its_heading() -> None:
    broken = []
    anchors: dict[Path, set[str]] = {}  # each linked file parsed once (README links docs/cli.md two dozen times)
    for path in tracked_markdown():
        for target in link_targets(path.read_text()):
            parts = urlsplit(target)
            if parts.scheme or parts.netloc:
                continue
            linked = (path.parent / unquote(parts.path)).resolve() if parts.path else path
            if not linked.exists():
                broken.append(f"{path.relative_to(CHECKOUT)}: {target}: no such file")
            elif parts.fragment and linked.suffix == ".md":
                if linked not in anchors:
                    anchors[linked] = heading_anchors(linked.read_text())
                if parts.fragment not in anchors[linked]:
                    broken.append(f"{path.relative_to(CHECKOUT)}: {target}: no such heading")
    assert not broken, "\n".join(broken)


def test_the_http_api_doc_is_what_the_app_s_openapi_document_makes(tiny_model_dir: Path) -> None:
    spec = importlib.util.spec_from_file_location("gen_http_api_doc", HTTP_API_SCRIPT)
    assert spec is not None and spec.loader is not None
    generator = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(generator)
    made = generator.render(generator.openapi_document(tiny_model_dir))
    assert "## Fleet routes" in made and "### `POST /v1/chat/completions`" in made and "### FleetStatus" in made
    assert generator.DOC.read_text() == made, f"docs/http-api.md is stale: run `{generator.REGENERATE}`"
