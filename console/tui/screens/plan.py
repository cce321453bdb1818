"""`p`: the planner's view of the fleet (`GET /fleet/plan`), opening on the split regret the fleet keeps (the
current layout's share of the best layout's goodput, replayed every 30 s): then the current split, the recommended
one, the advice (move only when a layout's goodput band clears the current one's; on the 5 min window the same
replay and the same words as the split regret), the predicted gain and the reason, every layout it replayed with its
band, and a picture of each one's TTFT and TPOT p90 against the SLOs — and `a` to rebalance to the advised layout,
colocated included (a dry run first, listed in the confirmation; disabled in read-only consoles)."""

from textual import work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import Screen
from textual.widgets import DataTable, Label

from fleetctl.console.client import FleetClientError
from fleetctl.console.tui.actions import READONLY_REASON
from fleetctl.console.tui.widgets.footer import FittingFooter
from fleetctl.console.tui.widgets.format import percent
from fleetctl.console.tui.widgets.slo_bars import SloBars
from fleetctl.engine.api.reports import FleetPlan, SplitInfo
from fleetctl.engine.api.reports import layout_label as split_label
from fleetctl.engine.api.status import SplitRegretInfo

# `w` steps through them; the first, the default, is the split regret's window: the fleet answers it with the
# replay the pool panels show, so the two agree
WINDOWS = ("5m", "10m", "30m", "1h")


def layout_label(layout: SplitInfo) -> str:
    return split_label(layout.prefill, layout.decode, layout.mixed)


def gain_text(gain: float | str | None) -> str:
    if gain is None:
        return "no gain to compare (no current split)"
    if gain == "inf":
        return "the current split meets no request's SLOs"
    return f"{gain:+.1f} % goodput predicted"


def regret_text(regret: SplitRegretInfo | None) -> str:
    if regret is None:
        return "split regret: not replayed yet (it needs a metrics store and 30 s of traffic)"
    if regret.advice:  # the replay's advice, word for word the plan's for the same replay
        return f"split regret (last 5 min): {regret.advice}"
    if regret.current == regret.best:
        return f"split regret: none — {regret.current} is the best layout over the last 5 min"
    return (f"split regret: the current layout {regret.current} serves {percent(regret.ratio)} of the best "
            f"layout's goodput over the last 5 min (best: {regret.best})")


def summary_lines(plan: FleetPlan) -> list[str]:
    """What the operator reads first: where the fleet is, where it should be, by how much and why."""
    slo = plan.slo
    current = plan.current
    best = plan.best_split
    recommended = plan.recommended
    lines = [f"{plan.requests} requests over {plan.window_s:.0f} s; SLOs TTFT ≤ {slo.ttft_s:g} s, "
             f"TPOT ≤ {slo.tpot_s * 1000:g} ms",
             f"current      {layout_label(current) if current else '-'}",
             f"recommended  {layout_label(recommended)}"]
    if plan.advice and plan.advice.verdict != "unknown":  # unknown: no current layout to weigh it against
        lines.append(f"advice       {plan.advice.sentence}")
    if best and layout_label(best) != layout_label(recommended):
        lines.append(f"best split   {layout_label(best)} (the best prefill:decode split)")
    lines.append(f"gain         {gain_text(plan.gain_pct)}")
    lines.append(f"why          {plan.reason}")
    lines += [f"note         {note}" for note in plan.notes]
    return lines


class PlanScreen(Screen[None]):
    BINDINGS = [Binding("escape,backspace", "back", "Back"),
                Binding("a", "apply", "apply advice"),
                Binding("r", "replan", "plan again"),
                Binding("w", "window", "window")]

    def __init__(self) -> None:
        super().__init__()
        self.window = WINDOWS[0]
        self.plan: FleetPlan | None = None

    def compose(self) -> ComposeResult:
        with Vertical(id="plan-summary"):
            status = self.app.reading.status
            yield Label(regret_text(status.split_regret if status else None), id="plan-regret")
            yield Label("planning…", id="plan-text")
        table = DataTable(id="plan-candidates", cursor_type="row")
        table.border_title = "layouts replayed, best first"
        yield table
        bars = SloBars(id="plan-slo")
        bars.border_title = "latency against the SLOs"
        yield bars
        yield FittingFooter()

    def on_mount(self) -> None:
        self.query_one("#plan-candidates", DataTable).add_columns(
            "layout", "goodput/s", "band/s", "good", "TTFT p90", "TPOT p90", "")
        self.action_replan()

    @work(exclusive=True, group="plan")
    async def action_replan(self) -> None:
        summary = self.query_one("#plan-summary")
        summary.border_title = f"plan · last {self.window}"
        self.query_one("#plan-text", Label).update(f"planning over the last {self.window}…")
        try:
            plan = await self.app.source.plan(self.window)
        except FleetClientError as exc:
            self.plan = None
            self.query_one("#plan-text", Label).update(f"no plan: {exc}")
            self.query_one("#plan-candidates", DataTable).clear()
            self.query_one(SloBars).show(None)
            return
        self.show(plan)

    def show(self, plan: FleetPlan) -> None:
        self.plan = plan
        self.query_one("#plan-text", Label).update("\n".join(summary_lines(plan)))
        self.query_one(SloBars).show(plan)
        table = self.query_one("#plan-candidates", DataTable)
        table.clear()
        current = layout_label(plan.current) if plan.current else None
        for c in plan.candidates:
            label = layout_label(c)
            tpot = "-" if c.tpot_p90_s is None else f"{c.tpot_p90_s:.3f} s"
            band = f"{c.goodput_band[0]:.3f}–{c.goodput_band[1]:.3f}" if c.goodput_band else "-"
            table.add_row(label, f"{c.goodput:.3f}", band, f"{c.good_requests}/{c.requests}",
                          f"{c.ttft_p90_s:.3f} s", tpot, "current" if label == current else "")

    def action_back(self) -> None:
        # Planning takes seconds: cancel it here, or its answer lands on a screen already taken down.
        self.workers.cancel_node(self)
        self.app.pop_screen()

    def action_window(self) -> None:
        self.window = WINDOWS[(WINDOWS.index(self.window) + 1) % len(WINDOWS)]
        self.action_replan()

    def action_apply(self) -> None:
        if self.app.readonly:
            self.notify(READONLY_REASON, severity="warning")
            return
        if not self.plan:
            self.notify("no layout to apply: plan first (r)", severity="warning")
            return
        advice = self.plan.advice
        if advice and advice.verdict == "keep":
            self.notify(f"the advice is to {advice.sentence} — nothing to apply (b rebalances to any split)",
                        title="plan", timeout=8)
            return
        target = advice.layout if advice and advice.verdict == "move" else layout_label(self.plan.recommended)
        self.app.flows.launch("rebalance", self.app.flows.rebalance_to(target))
