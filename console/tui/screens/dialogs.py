"""Modal dialogs: confirm a destructive action, pick one of several choices (a device, a checkpoint),
and follow a long operation to its end with a progress bar fed by `/fleet/operations/{id}` (`OperationInfo`)."""

import asyncio

from textual import on, work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.css.query import NoMatches
from textual.screen import ModalScreen
from textual.widgets import Button, Input, Label, OptionList, ProgressBar
from textual.widgets.option_list import Option

from fleetctl.console.client import FleetClientError
from fleetctl.console.tui.source import FleetSource
from fleetctl.engine.api.operations import OperationInfo, OpState, describe

POLL_S = 0.2


class ConfirmDialog(ModalScreen[bool]):
    BINDINGS = [Binding("escape", "dismiss(False)", "Cancel"), Binding("y", "dismiss(True)", "Yes")]

    def __init__(self, question: str) -> None:
        super().__init__()
        self.question = question

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog"):
            yield Label(self.question, classes="title")
            with Horizontal(classes="buttons"):
                yield Button("Cancel", id="no")
                yield Button("Confirm (y)", id="yes", variant="error")

    @on(Button.Pressed)
    def answer(self, event: Button.Pressed) -> None:
        self.dismiss(event.button.id == "yes")


class ChoiceDialog(ModalScreen[str | None]):
    """Pick one of `choices`; with `free_text`, an input also takes a value the list lacks."""

    BINDINGS = [Binding("escape", "dismiss(None)", "Cancel")]

    def __init__(self, title: str, choices: list[tuple[str, str]], free_text: str | None = None) -> None:
        super().__init__()
        self.title_text = title
        self.choices = choices  # (value, label)
        self.free_text = free_text

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog"):
            yield Label(self.title_text, classes="title")
            if self.choices:
                yield OptionList(*(Option(label, id=value) for value, label in self.choices), id="choices")
            else:
                yield Label("(nothing to choose from)")
            if self.free_text is not None:
                yield Input(placeholder=self.free_text, id="free")

    @on(OptionList.OptionSelected)
    def chosen(self, event: OptionList.OptionSelected) -> None:
        self.dismiss(event.option.id)

    @on(Input.Submitted)
    def typed(self, event: Input.Submitted) -> None:
        self.dismiss(event.value.strip() or None)


class OperationDialog(ModalScreen[OperationInfo | None]):
    """Follows one operation (its bar is `op.progress`); the result (`schemas.describe`'s sentence, the CLI's) or
    the failure stays on screen until dismissed."""

    BINDINGS = [Binding("escape,enter", "close", "Close")]

    def __init__(self, source: FleetSource, operation: OperationInfo) -> None:
        super().__init__()
        self.source = source
        self.operation = operation

    def compose(self) -> ComposeResult:
        op = self.operation
        with Vertical(classes="dialog"):
            yield Label(f"{op.kind} {op.worker}", classes="title", id="op-title")
            yield ProgressBar(total=1.0, show_eta=False, id="op-progress")
            yield Label(op.stage, id="op-stage")
            yield Label("", id="op-result")

    def on_mount(self) -> None:
        self.follow()

    @work(exclusive=True)
    async def follow(self) -> None:
        try:
            await self._follow()
        except NoMatches:
            return  # the dialog was taken down (closed, or the console quit) while a poll's answer was on its way

    async def _follow(self) -> None:
        op = self.operation
        while op.state is OpState.RUNNING:
            self.show(op)
            await asyncio.sleep(POLL_S)
            try:
                op = await self.source.operation(op.id)
            except FleetClientError as exc:
                self.query_one("#op-result", Label).update(f"lost track of the operation: {exc}")
                return
        self.operation = op
        self.show(op)

    def show(self, op: OperationInfo) -> None:
        bar = self.query_one("#op-progress", ProgressBar)
        bar.update(total=None if op.progress is None else 1.0, progress=op.progress or 0.0)
        running = op.state is OpState.RUNNING
        self.query_one("#op-stage", Label).update(op.stage if running else op.state.value)
        if not running:
            self.query_one("#op-result", Label).update(describe(op) + "\n(enter to close)")

    def action_close(self) -> None:
        # A poll may be in flight: cancel it (an answer that lands anyway finds no widgets and ends `follow`).
        self.workers.cancel_node(self)
        self.dismiss(self.operation if self.operation.state is not OpState.RUNNING else None)
