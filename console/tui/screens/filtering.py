"""What the dashboard, the requests and the logs views share: a filter field under their content, opened by `/`.
Typing filters at once (the screen's `apply_filter`), enter keeps the words and returns to the content, escape
clears them and returns (and, on a view, leaves it the next time)."""

from textual.binding import Binding
from textual.widget import Widget
from textual.widgets import Input

PLACEHOLDER = "filter: words every shown line has (enter keeps them, escape clears them)"


class FilterField(Input):
    BINDINGS = [Binding("escape", "clear", "Clear the filter")]

    def __init__(self, field_id: str) -> None:
        super().__init__(placeholder=PLACEHOLDER, id=field_id)
        self.display = False

    def action_clear(self) -> None:
        """No words (a Changed the owner filters on), then back to the content as enter goes (a Submitted)."""
        self.value = ""
        self.post_message(self.Submitted(self, ""))


class Filtering:
    """A Screen mixin: `filter_field` and `content` are the ids of its FilterField and of what it filters."""

    filter_field: str
    content: str
    words: str = ""

    def apply_filter(self) -> None: ...

    def action_filter(self) -> None:
        field = self.query_one(f"#{self.filter_field}", Input)
        field.display = True
        field.focus()

    def on_input_changed(self, event: Input.Changed) -> None:
        self.words = event.value
        self.apply_filter()

    def on_input_submitted(self, event: Input.Submitted) -> None:
        event.input.display = False
        self.query_one(f"#{self.content}", Widget).focus()

    def action_back(self) -> None:
        self.app.pop_screen()
