"""Textual's footer, compact, showing only the keys that fit whole: where the screen is too narrow for all of
them (the dashboard at 80 columns) the last ones give way — `?` lists every key — rather than one being cut at
the edge or under the command palette's hint. Decided as the keys are made, from their text (a compact key is
`key description`, one column between keys; the palette's hint is docked right), so a picture never catches the
footer half fitted; a new width composes it again."""

from textual.app import ComposeResult
from textual.events import Resize
from textual.widgets import Footer
from textual.widgets._footer import FooterKey

PALETTE_HINT = "^p palette"


class FittingFooter(Footer):
    def __init__(self) -> None:
        super().__init__(compact=True)
        self._width = 0

    def compose(self) -> ComposeResult:
        self._width = self.app.size.width
        room = self._width - len(PALETTE_HINT) - 2  # the hint and the separator before it
        used, full = 0, False
        for widget in super().compose():
            if isinstance(widget, FooterKey) and not widget.has_class("-command-palette"):
                used += len(widget.key_display) + 1 + len(widget.description)
                full = full or used > room
                used += 1
                if full:
                    continue
            yield widget

    def on_resize(self, _: Resize) -> None:
        if self.app.size.width != self._width:
            self.refresh(recompose=True)
