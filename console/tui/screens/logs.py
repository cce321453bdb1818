"""`l`: the fleet's and its workers' recent log lines (`GET /fleet/logs`), followed live: warnings and errors
coloured, `/` filters them (words, any case), `w` steps through the sources (every one, the fleet's own, each
worker). A failed worker selected on the dashboard opens it on that worker's last lines."""

from collections import deque
from contextlib import suppress

from rich.text import Text
from textual import work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.css.query import NoMatches
from textual.screen import Screen
from textual.widgets import RichLog

from fleetctl.console.client import FleetClientError
from fleetctl.console.tui.screens.filtering import FilterField, Filtering
from fleetctl.console.tui.widgets.footer import FittingFooter
from fleetctl.console.tui.widgets.format import clock
from fleetctl.engine.api.status import LogLineInfo

KEEP = 2000  # lines the screen holds (the fleet keeps 1,000 per source)
STYLES = {"warning": "yellow", "error": "bold red"}
ALL = "all"


def matches(line: LogLineInfo, source: str, words: str) -> bool:
    """Whether `line` is shown under the source chosen (`all`, `fleet` or a worker id) and the filter's words."""
    if source != ALL and line.source != source:
        return False
    haystack = f"{line.source} {line.level} {line.text}".lower()
    return all(word in haystack for word in words.lower().split())


def rendered(line: LogLineInfo) -> Text:
    text = Text(f"{clock(line.time)} {line.source:<10} ", style="dim")
    text.append(line.text, style=STYLES.get(line.level, ""))
    return text


def _write(log: RichLog, line: LogLineInfo) -> None:
    """Wrapped at words to the log's width (RichLog would measure against the app console's 80 columns)."""
    log.write(rendered(line), width=log.scrollable_content_region.width or None)


class LogsScreen(Filtering, Screen[None]):
    BINDINGS = [Binding("escape,backspace", "back", "Back"),
                Binding("slash", "filter", "filter"),
                Binding("w", "source", "source")]

    filter_field, content = "log-filter", "log-lines"

    def __init__(self, source: str = ALL, sources: list[str] | None = None) -> None:
        super().__init__()
        self.source = source  # `all`, `fleet` or a worker id
        self.sources = [ALL, "fleet", *(sources or [])]
        if source not in self.sources:
            self.sources.append(source)
        self.words = ""
        self.lines: deque[LogLineInfo] = deque(maxlen=KEEP)
        self.since = 0  # the last line's seq: only newer ones are asked for

    def compose(self) -> ComposeResult:
        log = RichLog(id="log-lines", wrap=True, markup=False, max_lines=KEEP, min_width=20)
        yield log
        yield FilterField("log-filter")
        yield FittingFooter()

    def on_mount(self) -> None:
        self._title()
        self.call_after_refresh(self.poll)  # once laid out: a line is wrapped to the width it is written at
        self.set_interval(self.app.settings.interval, self.poll)

    def on_resize(self) -> None:
        self.call_after_refresh(self._rewrap)

    def _rewrap(self) -> None:
        with suppress(NoMatches):  # wrapped again to the new width, unless the screen is closing by then
            self.redraw()

    def _title(self) -> None:
        chosen = "every source" if self.source == ALL else self.source
        filtered = f" · filter: {self.words}" if self.words else ""
        self.query_one("#log-lines", RichLog).border_title = f"logs · {chosen}{filtered}"

    @work(exclusive=True, group="logs")
    async def poll(self) -> None:
        try:
            answer = await self.app.source.logs(None, self.since)
        except FleetClientError as exc:
            answer, problem = None, f"no logs: {exc}"
        with suppress(NoMatches):  # the screen closed (or the app quits) while it asked: nothing to show
            log = self.query_one("#log-lines", RichLog)
            log.border_subtitle = "" if answer else problem
            if answer is None:
                return
            self.since = answer.next
            self.lines.extend(answer.lines)
            for line in answer.lines:
                if matches(line, self.source, self.words):
                    _write(log, line)

    def apply_filter(self) -> None:
        self.redraw()

    def redraw(self) -> None:
        log = self.query_one("#log-lines", RichLog)
        log.clear()
        for line in self.lines:
            if matches(line, self.source, self.words):
                _write(log, line)
        self._title()

    def action_source(self) -> None:
        self.source = self.sources[(self.sources.index(self.source) + 1) % len(self.sources)]
        self.redraw()
