"""The console's actions from the keyboard: against a real fleet (worker processes on the tiny model)
a decode worker is migrated to a free CPU slot while streams run, its sessions move live, and every stream
completes unchanged; in read-only mode the same keys change nothing and say why; the plan screen rebalances to the
best split after showing the dry run's moves."""

import asyncio
from pathlib import Path

import httpx
import pytest
from support.console_fixture import PLAN, POOLS, SPLIT_REGRET, FixtureSource, pilot_until
from support.fleet_harness import Stream, generate_json, serve, start_streams
from textual.pilot import Pilot
from textual.widgets import Label

from fleetctl.console.console_settings import ConsoleSettings
from fleetctl.console.tui.actions import ACTIONS, READONLY_REASON
from fleetctl.console.tui.app import FleetConsole
from fleetctl.console.tui.screens.dialogs import ChoiceDialog, ConfirmDialog, OperationDialog
from fleetctl.console.tui.screens.plan import PlanScreen
from fleetctl.console.tui.source import HttpSource
from fleetctl.console.tui.widgets.workers import WorkersTable
from fleetctl.engine.api.admin_token import read_admin_token
from fleetctl.engine.api.operation_results import LiveMigrateResult
from fleetctl.engine.api.operations import OperationInfo, OpState
from fleetctl.engine.api.reports import FleetPlan, PlanAdvice, SplitInfo

PROMPTS = ["The quick brown fox", "Once upon a time there was a small model", "def add(a, b):"]
TOKENS = 200
FLEET = ("--prefill", "1", "--decode", "2", "--devices", "cpu:0,cpu:1,cpu:2", "--dtype", "float32",
         "--deterministic", "--kv-blocks", "256")


def select(app: FleetConsole, worker_id: str) -> None:
    table = app.query_one(WorkersTable)
    table.move_cursor(row=[key.value for key in table.rows].index(worker_id))


def test_readonly_keys_change_nothing_and_say_why() -> None:
    source = FixtureSource()

    async def run() -> list[str]:
        app = FleetConsole(source, ConsoleSettings(readonly=True))
        async with app.run_test(size=(120, 40)) as pilot:
            await pilot_until(pilot, lambda: app.reading.reachable)
            for action in ACTIONS:
                if action.changes_fleet:
                    await pilot.press(action.keys.split(",")[0])
                    await pilot.pause(0.05)
            return [n.message for n in app._notifications]

    messages = asyncio.run(run())
    changing = [a for a in ACTIONS if a.changes_fleet]
    assert source.posted == []
    assert messages.count(READONLY_REASON) == len(changing)


def apply_from_the_plan_screen(source: FixtureSource) -> str:
    """Open the plan screen, press `a`, confirm; returns the confirmation's question."""
    question: list[str] = []

    async def run() -> None:
        app = FleetConsole(source, ConsoleSettings())
        async with app.run_test(size=(120, 40)) as pilot:
            await pilot_until(pilot, lambda: app.reading.reachable)
            await pilot.press("p")
            await pilot_until(pilot, lambda: isinstance(app.screen, PlanScreen) and app.screen.plan is not None)
            await pilot.press("a")
            await pilot_until(pilot, lambda: isinstance(app.screen, ConfirmDialog))
            question.append(str(app.screen.question))
            await pilot.press("y")
            await pilot_until(pilot, lambda: len(source.posted) == 2)

    asyncio.run(run())
    return question[0]


def test_plan_screen_applies_the_best_split_after_a_dry_run() -> None:
    source = FixtureSource()
    assert "decode-2 on cpu:4: decode → prefill" in apply_from_the_plan_screen(source)
    assert source.posted == [("/fleet/rebalance", {"split": "3:3", "apply": False}),
                             ("/fleet/rebalance", {"split": "3:3", "apply": True})]


async def choices_after(pilot: Pilot, app: FleetConsole, key: str) -> list[str]:
    """Press `key` on the loaded dashboard: the values its choice dialog offers."""
    await pilot_until(pilot, lambda: app.reading.reachable)
    await pilot.press(key)
    await pilot_until(pilot, lambda: isinstance(app.screen, ChoiceDialog))
    return [value for value, _ in app.screen.choices]


def test_switch_a_worker_from_the_keyboard() -> None:
    """w on decode-1: the roles it does not have, a confirmation, then the switch followed to the CLI's sentence."""
    source = FixtureSource()

    async def run() -> tuple[list[str], str]:
        app = FleetConsole(source, ConsoleSettings())
        async with app.run_test(size=(120, 40)) as pilot:
            await pilot_until(pilot, lambda: app.reading.worker("decode-1") is not None)
            select(app, "decode-1")
            offered = await choices_after(pilot, app, "w")
            await pilot.press("down", "enter")  # mixed
            await pilot_until(pilot, lambda: isinstance(app.screen, ConfirmDialog))
            await pilot.press("y")
            await pilot_until(pilot, lambda: isinstance(app.screen, OperationDialog)
                              and app.screen.operation.state is OpState.DONE)
            return offered, str(app.screen.query_one("#op-result").render())

    offered, sentence = asyncio.run(run())
    assert offered == ["prefill", "mixed"]
    assert source.posted == [("/fleet/workers/decode-1/switch", {"role": "mixed"})]
    assert sentence.startswith("decode-1 is now mixed-0 (decode → mixed, the same process 4104)")


def test_rebalance_to_a_typed_split_shows_the_dry_run_first() -> None:
    """b offers the split regret's best layout and takes a typed one; the dry run's steps are confirmed first."""
    source = FixtureSource()

    async def run() -> tuple[list[str], str]:
        app = FleetConsole(source, ConsoleSettings())
        async with app.run_test(size=(120, 40)) as pilot:
            offered = await choices_after(pilot, app, "b")
            app.screen.query_one("#free").focus()
            await pilot.press(*"4:2", "enter")
            await pilot_until(pilot, lambda: isinstance(app.screen, ConfirmDialog))
            question = str(app.screen.question)
            await pilot.press("y")
            await pilot_until(pilot, lambda: len(source.posted) == 2)
            return offered, question

    offered, question = asyncio.run(run())
    assert offered == ["3:3"]
    assert question.startswith("Rebalance 2:4 → 4:2?") and "decode-2 on cpu:4: decode → prefill" in question
    assert source.posted == [("/fleet/rebalance", {"split": "4:2", "apply": False}),
                             ("/fleet/rebalance", {"split": "4:2", "apply": True})]


def test_plan_screen_applies_a_colocated_recommendation() -> None:
    """Rebalance reaches colocated live: `a` applies the advised layout, not the best prefill:decode split."""
    colocated = {"prefill": 0, "decode": 0, "mixed": 6, "layout": "colocated"}
    advice = PlanAdvice(verdict="move", layout="colocated 6", sentence="move to colocated 6: …")
    source = FixtureSource(plan=PLAN.model_copy(update={"recommended": SplitInfo.model_validate(colocated),
                                                        "advice": advice}))
    apply_from_the_plan_screen(source)
    assert source.posted == [("/fleet/rebalance", {"split": "colocated 6", "apply": False}),
                             ("/fleet/rebalance", {"split": "colocated 6", "apply": True})]


def test_the_plan_screen_says_the_split_regrets_words_and_applies_nothing_when_the_advice_is_to_keep() -> None:
    keep = PlanAdvice(verdict="keep", layout="2:4", sentence="keep 2:4: 3:3 serves +18.1 %, within the error (…)")
    source = FixtureSource(plan=PLAN.model_copy(update={"advice": keep}))

    async def run() -> tuple[str, str, list[str]]:
        app = FleetConsole(source, ConsoleSettings())
        async with app.run_test(size=(120, 40)) as pilot:
            await pilot_until(pilot, lambda: app.reading.reachable)
            await pilot.press("p")
            await pilot_until(pilot, lambda: isinstance(app.screen, PlanScreen) and app.screen.plan is not None)
            texts = [str(app.screen.query_one(f"#plan-{part}", Label).render()) for part in ("regret", "text")]
            await pilot.press("a")
            await pilot.pause(0.1)
            return texts[0], texts[1], [n.message for n in app._notifications]

    regret, text, notices = asyncio.run(run())
    assert regret == f"split regret (last 5 min): {SPLIT_REGRET.advice}"  # the fixture's regret: the 5 min replay
    assert f"advice       {keep.sentence}" in text
    assert source.posted == [] and any(n.startswith("the advice is to keep 2:4") for n in notices)


def test_plan_screen_in_readonly_mode_shows_the_plan_but_applies_nothing() -> None:
    source = FixtureSource()

    async def run() -> list[str]:
        app = FleetConsole(source, ConsoleSettings(readonly=True))
        async with app.run_test(size=(120, 40)) as pilot:
            await pilot_until(pilot, lambda: app.reading.reachable)
            await pilot.press("p")
            await pilot_until(pilot, lambda: isinstance(app.screen, PlanScreen) and app.screen.plan is not None)
            await pilot.press("a")
            await pilot.pause(0.1)
            return [n.message for n in app._notifications]

    assert READONLY_REASON in asyncio.run(run())
    assert source.posted == []


class SlowSource(FixtureSource):
    """Polls of an operation and plans take `delay_s`, so a screen can be closed with a request in flight."""

    def __init__(self, delay_s: float, hold_at: int | None = None) -> None:
        super().__init__(hold_at=hold_at)
        self.delay_s = delay_s

    async def operation(self, op_id: str) -> OperationInfo:
        await asyncio.sleep(self.delay_s)
        return await super().operation(op_id)

    async def plan(self, since: str) -> FleetPlan:
        await asyncio.sleep(self.delay_s)
        return await super().plan(since)


def test_closing_the_progress_dialog_cancels_its_poll_at_once() -> None:
    """CI once saw a poll answer land on a dialog already taken down (its labels gone, the app crashed): the
    screen's own workers are only cancelled when it unmounts, after its children are removed, so closing
    must cancel the poll itself."""
    source = SlowSource(0.3, hold_at=1)

    async def run() -> tuple[bool, bool]:
        app = FleetConsole(source, ConsoleSettings())
        async with app.run_test(size=(120, 40)) as pilot:
            await pilot_until(pilot, lambda: app.reading.reachable)
            await pilot.press("down", "down", "m")
            await pilot.pause(0.2)
            await pilot.press("enter")
            await pilot.pause(0.2)
            await pilot.press("y")
            await pilot_until(pilot, lambda: isinstance(app.screen, OperationDialog) and source._polls >= 1)
            dialog = app.screen
            polls = [w for w in app.workers if w.node is dialog]
            dialog.action_close()
            cancelled_at_once = bool(polls) and all(w.is_cancelled for w in polls)
            await pilot.pause(0.6)  # long enough for the poll in flight to have answered
            return cancelled_at_once, isinstance(app.screen, OperationDialog)

    assert asyncio.run(run()) == (True, False)


def test_leaving_the_plan_screen_while_it_plans_cancels_the_plan() -> None:
    async def run() -> tuple[bool, bool]:
        app = FleetConsole(SlowSource(30.0), ConsoleSettings())
        async with app.run_test(size=(120, 40)) as pilot:
            await pilot_until(pilot, lambda: app.reading.reachable)
            await pilot.press("p")
            await pilot_until(pilot, lambda: isinstance(app.screen, PlanScreen))
            plan_screen = app.screen
            planning = [w for w in app.workers if w.node is plan_screen]
            plan_screen.action_back()  # what escape does
            cancelled_at_once = bool(planning) and all(w.is_cancelled for w in planning)
            await pilot.pause(0.6)
            return cancelled_at_once, isinstance(app.screen, PlanScreen)

    assert asyncio.run(run()) == (True, False)


@pytest.mark.fleet
def test_migrate_a_decode_worker_from_the_keyboard(small_model_dir: Path) -> None:
    """Every decode step is slowed (a fault point's stall) so that the streams are still decoding when the
    migration moves decode-0's sessions: it must move at least one of them, live, and each stream still ends
    exactly as `generate` makes it."""
    reference = generate_json(small_model_dir, PROMPTS, "--dtype", "float32", "--deterministic", "--max-tokens",
                              str(TOKENS), "--ignore-eos")
    streams = [Stream(prompt, request_id=f"console-{i}") for i, prompt in enumerate(PROMPTS)]
    with serve(small_model_dir, *FLEET, env={"FLEET_FAULTS": "step=stall:0.05"}) as url:
        texts = start_streams(url, streams, TOKENS, small_model_dir.name)

        async def drive() -> tuple[OperationInfo, str]:
            app = FleetConsole(HttpSource(url, read_admin_token()), ConsoleSettings(interval=0.5))
            async with app.run_test(size=(120, 40)) as pilot:
                await pilot_until(pilot, lambda: app.reading.worker("decode-0") is not None)
                select(app, "decode-0")
                await pilot.press("m")
                await pilot_until(pilot, lambda: isinstance(app.screen, ChoiceDialog))
                await pilot.press("enter")  # the first free device: cpu:3
                await pilot_until(pilot, lambda: isinstance(app.screen, ConfirmDialog))
                await pilot_until(pilot, lambda: getattr(app.reading.worker("decode-0"), "sessions", 0) >= 1)
                assert not texts.done(), "the streams ended before the migration started"
                await pilot.press("y")
                await pilot_until(pilot, lambda: isinstance(app.screen, OperationDialog))
                dialog = app.screen
                await pilot_until(pilot, lambda: dialog.operation.state is not OpState.RUNNING, timeout=120)
                await pilot_until(pilot, lambda: getattr(app.reading.worker("decode-0"), "device", None) == "cpu:3")
                await pilot.press("enter")  # close the result
                return dialog.operation, app.reading.worker("decode-0").state

        operation, state = asyncio.run(drive())
        assert operation.state is OpState.DONE, operation.error
        assert state == "running"
        result = operation.result
        assert isinstance(result, LiveMigrateResult) and (result.from_, result.to) == ("cpu:1", "cpu:3")
        moved = [move.request for move in result.moves]
        assert result.sessions == len(moved) >= 1 and set(moved) <= {stream.request_id for stream in streams}
        assert texts.result(timeout=300) == [r["text"] for r in reference]
        workers = {w["id"]: w for w in httpx.get(f"{url}/fleet/workers", timeout=10).json()["workers"]}
        assert workers["decode-0"]["device"] == "cpu:3"


@pytest.mark.fleet
def test_start_drain_stop_and_switch_workers_from_the_keyboard(small_model_dir: Path) -> None:
    reference = generate_json(small_model_dir, PROMPTS, "--dtype", "float32", "--deterministic", "--max-tokens", "120",
                              "--ignore-eos")
    with serve(small_model_dir, *FLEET) as url:
        texts = start_streams(url, PROMPTS, 120, small_model_dir.name)

        async def drive() -> list[str]:
            app = FleetConsole(HttpSource(url, read_admin_token()), ConsoleSettings(interval=0.5))
            states = []
            async with app.run_test(size=(120, 40)) as pilot:
                await pilot_until(pilot, lambda: app.reading.reachable)
                await pilot.press("n")  # start: role (decode is listed first), then the first free device
                await pilot.pause(0.3)
                await pilot.press("enter")
                await pilot.pause(0.3)
                await pilot.press("enter")
                await pilot_until(pilot, lambda: getattr(app.reading.worker("decode-2"), "state", None) == "running",
                                  timeout=120)
                await pilot.press("enter")  # close the result
                states.append(app.reading.worker("decode-2").device)
                select(app, "decode-2")
                await pilot.press("d", "y")
                await pilot_until(pilot, lambda: app.reading.worker("decode-2").state == "draining")
                await pilot.pause(0.5)
                await pilot.press("enter")
                states.append(app.reading.worker("decode-2").state)
                select(app, "decode-2")
                await pilot.press("x")
                await pilot.pause(0.3)
                await pilot.press("enter")  # "drain first"
                await pilot.pause(0.3)
                await pilot.press("y")
                await pilot_until(pilot, lambda: app.reading.worker("decode-2").state == "stopped", timeout=120)
                states.append(app.reading.worker("decode-2").state)
                await pilot.press("enter")  # close the result
                select(app, "prefill-0")  # the only worker that takes prompts: refused, saying why
                await pilot.press("w")
                await pilot_until(pilot, lambda: isinstance(app.screen, ChoiceDialog))
                await pilot.press("enter", "y")  # decode
                await pilot_until(pilot, lambda: any("switch:" in n.message for n in app._notifications))
                states += [n.message for n in app._notifications if "switch:" in n.message]
                select(app, "decode-1")
                await pilot.press("w")
                await pilot_until(pilot, lambda: isinstance(app.screen, ChoiceDialog))
                await pilot.press("down", "enter", "y")  # mixed
                await pilot_until(pilot, lambda: getattr(app.reading.worker("mixed-0"), "state", None) == "running",
                                  timeout=120)
                states.append(app.reading.worker("mixed-0").device)
            return states

        states = asyncio.run(drive())
        assert states[:3] == ["cpu:3", "draining", "stopped"]
        assert len(states) == 5 and "prefill-0" in states[3] and "the last running" in states[3], states
        assert states[4] == "cpu:2"  # decode-1's device: the same process, in its new role
        assert texts.result(timeout=300) == [r["text"] for r in reference]


def test_a_pool_that_appears_while_the_console_runs_gets_its_panel() -> None:
    """A switch to mixed adds a mixed pool to /fleet/status: the console mounts its panel and fills it."""
    source = FixtureSource()

    async def run() -> str:
        app = FleetConsole(source, ConsoleSettings(interval=0.2))
        async with app.run_test(size=(120, 40)) as pilot:
            await pilot_until(pilot, lambda: app.reading.reachable)
            source.more_pools = {"mixed": POOLS["decode"]}
            await pilot_until(pilot, lambda: app.query("#mixed-verdict"))
            await pilot_until(pilot, lambda: "worker" in str(app.query_one("#pool-mixed").border_title))
            await pilot.pause(0.3)  # further readings reach it too
            return str(app.query_one("#pool-mixed").border_title)

    assert asyncio.run(run()) == "mixed · 4 workers · queue 0 · drafts kept 62%"
