"""A DataTable that draws each line itself and keeps it until what it shows changes. Textual's DataTable keys its
render caches by a count of all its updates, so one updated cell renders every visible cell of the table again
through Rich (at a 1 Hz refresh, with a cell ticking in each row — a request's age, a worker's tok/s — most of the
console's CPU). This one keeps DataTable's rows, columns, cursor, keys, mouse and scrolling and replaces its
`render_line`: a line is one Strip of padded cells, cached by the row's place, cells, widths and cursor, so a
refresh builds only the lines that changed. It draws what the console's tables use — one-line rows, a row cursor,
a header, zebra stripes, str or Rich Text cells (a str as plain text, where DataTable reads markup) — and no row
labels, fixed rows or columns, or mouse-hover highlight."""

from typing import Any

from rich.segment import Segment
from rich.style import Style
from rich.text import Text
from textual.cache import LRUCache
from textual.strip import Strip
from textual.widgets import DataTable

LINES_KEPT = 2_000  # drawn lines: a few screens' worth, each row with and without the cursor


def content_key(value: object) -> object:
    """What a cell shows, hashable (Rich's Text is not, and its equality ignores its style)."""
    if isinstance(value, Text):
        return value.plain, value.style, tuple(value.spans)
    return value


class LineTable(DataTable[Any]):
    def __init__(self, **kwargs: Any) -> None:
        super().__init__(cursor_type="row", **kwargs)
        self._lines: LRUCache[tuple[object, ...], Strip] = LRUCache(LINES_KEPT)
        self._styles: dict[tuple[str, object], Style] = {}

    def notify_style_update(self) -> None:
        """The theme or a pseudo-class (focus) changed: the lines' styles are drawn again."""
        self._lines.clear()
        self._styles.clear()
        super().notify_style_update()

    def render_line(self, y: int) -> Strip:
        width, base = self.size.width, self.rich_style
        scroll_x, scroll_y = self.scroll_offset
        row = -1 if self.show_header and y == 0 else y + scroll_y - self.show_header
        if row >= self.row_count:
            return Strip.blank(width, base)
        columns = self.ordered_columns
        cells = [column.label for column in columns] if row < 0 else self.get_row_at(row)
        widths = tuple(column.get_render_width(self) for column in columns)
        cursor = self.show_cursor and row == self.cursor_row
        key = (row, tuple(map(content_key, cells)), widths, cursor, width, scroll_x, base,
               self.get_pseudo_class_state())
        line = self._lines.get(key)
        if line is None:
            drawn = self._draw(row, cells, widths, cursor, base)
            line = self._lines[key] = drawn.crop_extend(scroll_x, scroll_x + width, base).simplify()
        return line

    def _draw(self, row: int, cells: list[object], widths: tuple[int, ...], cursor: bool, base: Style) -> Strip:
        """A row's cells as DataTable styles them: the row's style (header, zebra stripe), the cursor's over it, its
        colour over the cell's own (cursor_foreground_priority "css"); each cell carries its row and column for
        the mouse."""
        if row < 0:
            row_style = self._style("datatable--header")
        elif self.zebra_stripes:
            row_style = self._style("datatable--odd-row" if row % 2 else "datatable--even-row")
        else:
            row_style = base
        over = self._style("datatable--cursor") if cursor else Style()
        after = Style.from_color(color=over.color) if self.cursor_foreground_priority == "css" else Style()
        if self.cursor_background_priority == "css":
            after += Style.from_color(bgcolor=over.bgcolor)
        pad, console = self.cell_padding, self.app.console
        segments: list[Segment] = []
        for column, (cell, cell_width) in enumerate(zip(cells, widths, strict=True)):
            style = row_style + Style.from_meta({"row": row, "column": column}) + over
            text = cell.copy() if isinstance(cell, Text) else Text("" if cell is None else str(cell))
            text.truncate(max(cell_width - 2 * pad, 0), overflow="crop")
            own = style + console.get_style(text.style, default=Style.null())  # Text.render leaves it out
            segments.append(Segment(" " * pad, style + after))
            segments += (Segment(part.text, own + part.style + after) for part in text.render(console))
            segments.append(Segment(" " * (cell_width - pad - text.cell_len), style + after))
        rest = max(0, self.size.width - sum(widths))  # the row's style on to the right edge
        out_of_bounds = Style.from_meta({"row": row, "column": 0, "out_of_bounds": True})
        segments.append(Segment(" " * rest, row_style + over + out_of_bounds))
        return Strip(segments)

    def _style(self, component: str) -> Style:
        """A component class's style (computing one blends colours: kept until the styles change)."""
        key = (component, self.get_pseudo_class_state())
        if key not in self._styles:
            self._styles[key] = self.get_component_styles(component).rich_style
        return self._styles[key]
