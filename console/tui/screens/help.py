"""`?` / F1: every key the console answers to, from the one action list (with the operator's overrides)."""

from rich.table import Table
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical, VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Label, Static

from fleetctl.console.tui.actions import ACTIONS

NAVIGATION = (("↑ ↓", "select a worker"), ("tab", "the next panel: workers, events"),
              ("ctrl+p", "command palette: every action by name"), ("escape", "close a dialog or go back"))
KEY_NAMES = {"question_mark": "?", "slash": "/"}  # Textual's names for keys that are characters


def key_label(keys: str) -> str:
    return ",".join(KEY_NAMES.get(key, key) for key in keys.split(","))


class HelpScreen(ModalScreen[None]):
    BINDINGS = [Binding("escape,q,question_mark,f1", "dismiss", "Close")]

    def __init__(self, keys: dict[str, str], readonly: bool) -> None:
        super().__init__()
        disabled = " (disabled)"
        # (keys, what they do): every action with the operator's overrides, then the navigation keys
        self.rows = [(key_label(keys[action.id]),
                      action.description + (disabled if readonly and action.changes_fleet else ""))
                     for action in ACTIONS] + list(NAVIGATION)
        self.readonly = readonly

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog"):
            title = "keys" + (" (read-only: actions that change the fleet are disabled)" if self.readonly else "")
            yield Label(title, classes="title")
            with VerticalScroll(id="help-keys"):
                yield Static(self.table())

    def table(self) -> Table:
        """A description wraps at words within the dialog (a DataTable would cut it at the edge)."""
        table = Table(box=None, expand=True, header_style="bold", pad_edge=False)
        table.add_column("key", no_wrap=True)
        table.add_column("action", ratio=1)
        for key, what in self.rows:
            table.add_row(key, what)
        return table
