"""`enter` on an event (or a click): every field it was recorded with, unabridged, in a dialog."""

import json
import time

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import Label

from fleetctl.engine.api.history import EventRecord


def event_fields(event: EventRecord) -> list[tuple[str, str]]:
    """(name, value) of each field, the time in full (UTC) and a detail that is not a string as JSON."""
    when = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(event.ts))
    fields = [("time", when), ("kind", event.kind), ("worker", event.worker or "-")]
    return fields + [(name, value if isinstance(value, str) else json.dumps(value))
                     for name, value in event.details.items()]


class EventDetail(ModalScreen[None]):
    BINDINGS = [Binding("escape,enter,q", "dismiss", "Close")]

    def __init__(self, event: EventRecord) -> None:
        super().__init__()
        self.event = event

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog", id="event-detail"):
            yield Label(f"event · {self.event.kind} · {self.event.worker or 'fleet'}", classes="title")
            width = max(len(name) for name, _ in event_fields(self.event))
            for name, value in event_fields(self.event):
                yield Label(f"{name:<{width}}  {value}")
