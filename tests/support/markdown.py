"""Markdown read as GitHub renders it (GFM, through markdown-it-py's table rule): the rows of each table with
their cell counts, the links and images a file holds, and the anchors its headings get."""

import re
from dataclasses import dataclass
from itertools import pairwise

from markdown_it import MarkdownIt
from markdown_it.token import Token

_GFM = MarkdownIt("commonmark").enable("table")
_UNESCAPED_PIPE = re.compile(r"(?<!\\)\|")


@dataclass(frozen=True)
class TableRow:
    line: int  # 1-based, in the file
    cells: int
    header_cells: int


def cell_count(row: str) -> int:
    """Cells of a table row as GFM splits them: on every unescaped `|`, inside backticks too; a leading and a
    trailing pipe open and close the row, they part no cells."""
    text = row.strip()
    if text.startswith("|"):
        text = text[1:]
    if text.endswith("|") and not text.endswith("\\|"):
        text = text[:-1]
    return len(_UNESCAPED_PIPE.split(text))


def table_rows(markdown: str) -> list[TableRow]:
    """Every body row of every table, each with the cell count of its table's header. A row whose count
    differs renders wrong on GitHub: cells past the header's are dropped, a hard-wrapped row's tail is a row
    of its own."""
    lines = markdown.splitlines()
    rows: list[TableRow] = []
    header = 0
    for token in _GFM.parse(markdown):
        if token.type == "thead_open":
            header = -1
        elif token.type == "tr_open" and token.map is not None:
            cells = cell_count(lines[token.map[0]])
            if header == -1:
                header = cells
            else:
                rows.append(TableRow(token.map[0] + 1, cells, header))
    return rows


def link_targets(markdown: str) -> list[str]:
    """The href of every link and the src of every image, in order."""
    targets: list[str] = []
    for token in _GFM.parse(markdown):
        for child in token.children or []:
            if child.type == "link_open":
                targets.append(str(child.attrs["href"]))
            elif child.type == "image":
                targets.append(str(child.attrs["src"]))
    return targets


def _plain_text(inline: Token) -> str:
    return "".join(child.content for child in inline.children or [] if child.type in ("text", "code_inline"))


def github_slug(heading: str) -> str:
    """The anchor GitHub gives a heading: lower case, punctuation dropped (hyphens and underscores kept),
    each space a hyphen."""
    return re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-")


def heading_anchors(markdown: str) -> set[str]:
    """The anchors of a file's headings; a repeated one gets `-1`, `-2`, … as on GitHub."""
    anchors: set[str] = set()
    tokens = _GFM.parse(markdown)
    for opening, inline in pairwise(tokens):
        if opening.type != "heading_open":
            continue
        slug = github_slug(_plain_text(inline))
        anchor, repeat = slug, 0
        while anchor in anchors:
            repeat += 1
            anchor = f"{slug}-{repeat}"
        anchors.add(anchor)
    return anchors
