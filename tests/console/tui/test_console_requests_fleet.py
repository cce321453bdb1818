"""The requests view against a real fleet (worker processes on the tiny model, every step slowed so the streams
are still decoding): a decoding request's timeline opens while it decodes, `m` moves it live from the view to
the other decode worker, and every stream still ends exactly as `generate` makes it."""

import asyncio
from pathlib import Path

import pytest
from support.console_fixture import pilot_until
from support.fleet_harness import Stream, generate_json, serve, start_streams
from textual.widgets import DataTable, Label

from fleetctl.console.console_settings import ConsoleSettings
from fleetctl.console.tui.app import FleetConsole
from fleetctl.console.tui.screens.dialogs import ChoiceDialog, ConfirmDialog, OperationDialog
from fleetctl.console.tui.screens.requests import RequestsScreen
from fleetctl.console.tui.screens.timeline import TimelineScreen
from fleetctl.console.tui.source import HttpSource
from fleetctl.engine.api.admin_token import read_admin_token
from fleetctl.engine.api.operation_results import MoveResult
from fleetctl.engine.api.operations import OperationInfo, OpState

pytestmark = [pytest.mark.fleet, pytest.mark.slow]
PROMPTS = ["The quick brown fox", "Once upon a time there was a small model"]
TOKENS = 160
FLEET = ("--prefill", "1", "--decode", "2", "--devices", "cpu:0,cpu:1,cpu:2", "--dtype", "float32",
         "--deterministic", "--kv-blocks", "256")


def test_a_decoding_request_opened_and_moved_from_the_requests_view(tiny_model_dir: Path) -> None:
    reference = generate_json(tiny_model_dir, PROMPTS, "--dtype", "float32", "--deterministic", "--max-tokens",
                              str(TOKENS), "--ignore-eos")
    streams = [Stream(prompt, request_id=f"seen-{i}") for i, prompt in enumerate(PROMPTS)]
    with serve(tiny_model_dir, *FLEET, env={"FLEET_FAULTS": "step=stall:0.05"}) as url:
        texts = start_streams(url, streams, TOKENS, tiny_model_dir.name)

        async def drive() -> tuple[str, str, OperationInfo]:
            app = FleetConsole(HttpSource(url, read_admin_token()), ConsoleSettings(interval=0.5))
            async with app.run_test(size=(120, 40)) as pilot:
                await pilot_until(pilot, lambda: app.reading.reachable)
                await pilot.press("R")

                def decoding() -> str | None:
                    screen = app.screen
                    if not isinstance(screen, RequestsScreen):
                        return None
                    return next((r.request_id for r in screen.records.values()
                                 if r.stage == "decode" and r.request_id.startswith("seen-")), None)

                await pilot_until(pilot, lambda: decoding() is not None, timeout=60)
                rid = decoding()
                table = app.screen.query_one("#requests", DataTable)
                table.move_cursor(row=table.get_row_index(rid))
                await pilot.press("enter")
                await pilot_until(pilot, lambda: isinstance(app.screen, TimelineScreen))
                summary = str(app.screen.query_one("#timeline-summary", Label).render())
                await pilot.press("escape")
                table.move_cursor(row=table.get_row_index(rid))
                source = app.screen.records[rid].decode_worker
                assert not texts.done(), "the streams ended before the move"
                await pilot.press("m")
                await pilot_until(pilot, lambda: isinstance(app.screen, ChoiceDialog))
                await pilot.press("enter")  # the one other decode worker
                await pilot_until(pilot, lambda: isinstance(app.screen, ConfirmDialog))
                await pilot.press("y")
                await pilot_until(pilot, lambda: isinstance(app.screen, OperationDialog))
                dialog = app.screen
                await pilot_until(pilot, lambda: dialog.operation.state is not OpState.RUNNING, timeout=120)
                await pilot.press("enter")
                return summary, source, dialog.operation

        summary, source, operation = asyncio.run(drive())
        assert summary.startswith("decode · workers prefill-0 → decode-")
        assert operation.state is OpState.DONE, operation.error
        assert isinstance(operation.result, MoveResult) and operation.result.from_ == source
        assert operation.result.to != source and operation.result.to.startswith("decode-")
        assert texts.result(timeout=300) == [r["text"] for r in reference]
