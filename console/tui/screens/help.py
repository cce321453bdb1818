"""`?` / F1: every key the console answers to, from the one action list (with the operator's overrides)."""

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import DataTable, Label

from fleetctl.console.tui.actions import ACTIONS

NAVIGATION = (("↑ ↓", "select a worker"), ("ctrl+p", "command palette: every action by name"),
              ("escape", "close a dialog or go back"))


class HelpScreen(ModalScreen[None]):
    BINDINGS = [Binding("escape,q,question_mark,f1", "dismiss", "Close")]

    def __init__(self, keys: dict[str, str], readonly: bool) -> None:
        super().__init__()
        self.keys = keys  # binding id -> effective keys
        self.readonly = readonly

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog"):
            title = "keys" + (" (read-only: actions that change the fleet are disabled)" if self.readonly else "")
            yield Label(title, classes="title")
            yield DataTable(id="help-table", show_cursor=False)

    def on_mount(self) -> None:
        table = self.query_one(DataTable)
        table.add_columns("key", "action")
        for action in ACTIONS:
            disabled = " (disabled)" if self.readonly and action.changes_fleet else ""
            table.add_row(self.keys[action.id].replace("question_mark", "?"), action.description + disabled)
        for key, what in NAVIGATION:
            table.add_row(key, what)
