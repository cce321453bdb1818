"""The line-drawing table (the requests view's and the dashboard's worker table): a line is drawn as DataTable draws
it — header, zebra stripes, the row cursor, a cell's own colour — and, once drawn, kept until its row changes, so a
refresh with one changed cell draws one line again."""

import asyncio

from rich.text import Text
from textual.app import App, ComposeResult
from textual.geometry import Region
from textual.strip import Strip
from textual.widgets import DataTable

from fleetctl.console.tui.widgets.line_table import LineTable

ROWS = [("req-0001", Text("decoding", style="bold green"), "12.40 s"), ("req-0002", "queued", "310 ms"),
        ("req-0003", Text("failed", style="red"), "1.02 s"), ("req-0004", "done", "-")]


class Tables(App[None]):
    def compose(self) -> ComposeResult:
        yield LineTable(id="lines", zebra_stripes=True)
        yield DataTable(id="data", cursor_type="row", zebra_stripes=True)

    def on_mount(self) -> None:
        for table in self.query(DataTable):
            for column in ("request", "stage", "age"):
                table.add_column(column, key=column)
            for row in ROWS:
                table.add_row(*row, key=row[0])


def shown(table: DataTable) -> list[Strip]:
    """The table's lines as the screen gets them (its styles, focus tint included, applied)."""
    return table.render_lines(Region(0, 0, table.size.width, len(ROWS) + 1))


def test_lines_are_drawn_as_a_data_table_draws_them_and_kept_until_their_row_changes() -> None:
    async def run() -> tuple[list[list[Strip]], list[list[Strip]], list[bool]]:
        app = Tables()
        drawn: tuple[list[list[Strip]], list[list[Strip]]] = [], []
        async with app.run_test(size=(60, 12)) as pilot:
            tables = app.query_one("#lines", LineTable), app.query_one("#data", DataTable)
            for row, focused in ((0, False), (2, True), (3, True)):  # the cursor moved, the table focused or not
                for table, frames in zip(tables, drawn, strict=True):
                    table.move_cursor(row=row)
                    app.set_focus(table if focused else None)
                    await pilot.pause()
                    frames.append(shown(table))
            ours = tables[0]
            before = [ours.render_line(y) for y in range(len(ROWS) + 1)]
            ours.update_cell("req-0002", "age", "1.31 s")
            kept = [ours.render_line(y) is line for y, line in enumerate(before)]
        return *drawn, kept

    ours, theirs, kept = asyncio.run(run())
    assert [[list(line) for line in frame] for frame in ours] == [[list(line) for line in frame] for frame in theirs]
    assert kept == [True, True, False, True, True]  # the header and the rows but the second (line 2) kept
