"""One pool (prefill, decode or mixed): busy, MFU and MBU now, five minutes of each as a sparkline,
and a one-line verdict, so that an underfed or saturated phase shows at a glance; with a metrics store, the split
regret (the current layout's share of the best layout's goodput, replayed every interval) and its sparkline; with
KV tiers under the pools, a line of what each tier read back for this pool and how full it is; once its workers
finished requests whose output a grammar held (a JSON schema, tool calls), a line counting them. The decode pool says
how its prompts arrived over the last minute (handoffs, local prefills, recomputes) and, in a fleet with prefill
and decode pools, says plainly when most did not come by handoff: the fleet is not disaggregating."""

from textual.app import ComposeResult
from textual.containers import Horizontal, Vertical
from textual.widgets import Label

from fleetctl.console.tui.reading import FleetReading
from fleetctl.console.tui.widgets.chart import UsageChart
from fleetctl.console.tui.widgets.format import count, percent, show_text
from fleetctl.engine.api.status import FlowInfo, PoolInfo, SplitRegretInfo, TierInfo

METRICS = (("busy", "busy"), ("mfu", "MFU (compute)"), ("mbu", "MBU (memory)"))
# which metric a pool is judged by: prefill reads the prompt (compute), decode writes tokens (bandwidth)
BOUND_BY = {"prefill": "mfu", "decode": "mbu", "mixed": "mfu"}
REGRET_LABEL_W = 24  # .regret-label's width in the theme
MOSTLY_LOCAL_MIN = 5  # arrivals in the window before a share of them is called "mostly"
STRUCTURED_KINDS = {"json_schema": "json schema", "json_object": "json object", "tools": "tool calls"}
SHORT_KINDS = {"json_schema": "schema", "json_object": "json", "tools": "tools"}


def verdict(role: str, pool: PoolInfo | None) -> str:
    if pool is None or not pool.workers:
        return "no running worker"
    busy = pool.busy
    queue = pool.queue
    if pool.outlier:
        return f"uneven: {pool.outlier}"
    if busy < 0.3 and not queue:
        return f"underfed: idle {1 - busy:.0%} of the time"
    if busy > 0.9 or queue:
        return f"saturated: busy {busy:.0%}, {queue} waiting"
    bound = "compute" if BOUND_BY[role] == "mfu" else "bandwidth"
    return f"working: {bound} at {percent(getattr(pool, BOUND_BY[role]))} of peak"


def regret_label(regret: SplitRegretInfo) -> str:
    """`layout 2:4 is best`, or the current layout's goodput over the best one's and what the advice makes of it
    (`layout 85% of 3:3: move`, `keep 2:4 (97% of 3:3)` within the error, `move to 2:1 (held)` where a move advised
    earlier holds), the longest form that fits the label's REGRET_LABEL_W cells."""
    if regret.current == regret.best:
        return f"layout {regret.current} is best"
    share = f"{percent(regret.ratio)} of {regret.best}"
    if regret.verdict == "keep":
        forms = [f"layout {share}, within error", f"keep {regret.current} ({share})",
                 f"keep {regret.current} (within error)"]
    elif regret.verdict == "move" and regret.target == regret.best:
        forms = [f"layout {share}: move", f"move to {regret.target} ({percent(regret.ratio)})",
                 f"move to {regret.target}"]
    elif regret.verdict == "move":
        forms = [f"move to {regret.target} (held)"]
    else:
        forms = [f"layout {share}"]
    return next((form for form in forms if len(form) <= REGRET_LABEL_W), forms[-1])


def flow_line(flow: FlowInfo, disaggregated: bool, width: int = 80) -> tuple[str, bool]:
    """`last min: 42 handed off · 3 local · 1 recomputed`, or a shorter form where `width` is less, and whether it
    warns: in a fleet with prefill and decode pools, `not disaggregating: 80% of 20 prompts came without a
    handoff` when most did."""
    share = flow.local_share
    local = flow.local_prefills + flow.colocated + flow.decode_recomputes
    if disaggregated and share is not None and share > 0.5 and local + flow.handoffs >= MOSTLY_LOCAL_MIN:
        forms = [f"not disaggregating: {share:.0%} of {local + flow.handoffs} prompts came without a handoff",
                 f"not disaggregating: {share:.0%} without a handoff", f"not disaggregating: {share:.0%} local"]
        return next((form for form in forms if len(form) <= width), forms[-1]), True
    colocated = f" · {flow.colocated} colocated" if flow.colocated else ""
    here = f" ({flow.decode_recomputes} here)" if flow.decode_recomputes else ""
    forms = [f"last min: {flow.handoffs} handed off · {flow.local_prefills} local{colocated} · {flow.recomputes} "
             f"recomputed{here}",
             f"1 min: {flow.handoffs} handoffs · {flow.local_prefills} local{colocated} · {flow.recomputes} recomp.",
             f"{flow.handoffs} handoffs · {flow.local_prefills} local · {flow.recomputes} recomp."]
    return next((form for form in forms if len(form) <= width), forms[-1]), False


def tier_line(tiers: dict[str, TierInfo], served: dict[str, int], width: int) -> str:
    """`tiers: host 1.1k tok, 5% full · disk 240 tok, 1% full`: per tier the prompt tokens it read back for this
    pool and how full it is (the tiers are the node's, shared by every pool); shorter where `width` is less."""
    forms = []
    for words in (("tiers: ", " tok, ", " full"), ("tiers ", " tok ", ""), ("tiers ", " ", ""), ("", " ", "")):
        parts = []
        for name, info in tiers.items():
            full = info.used_bytes / info.capacity_bytes if info.capacity_bytes else 0.0
            parts.append(f"{name} {count(served.get(name, 0))}{words[1]}{full:.0%}{words[2]}")
        forms.append(words[0] + " · ".join(parts))
    return next((form for form in forms if len(form) <= width), forms[-1])


def structured_line(structured: dict[str, int], width: int) -> str:
    """`structured output: 9 json schema · 5 tool calls`: the finished requests this pool's workers computed whose
    output a grammar held, by kind, most first; shorter where `width` is less."""
    kinds = sorted(structured.items(), key=lambda kind: (-kind[1], kind[0]))
    named = " · ".join(f"{n} {STRUCTURED_KINDS.get(kind, kind)}" for kind, n in kinds)
    short = ", ".join(f"{n} {SHORT_KINDS.get(kind, kind)}" for kind, n in kinds)
    total = sum(structured.values())
    forms = [f"structured output: {named}", f"structured {total}: {short}", f"{total} structured"]
    return next((form for form in forms if len(form) <= width), forms[-1])


class PoolPanel(Vertical):
    def __init__(self, role: str) -> None:
        super().__init__(id=f"pool-{role}", classes=role)
        self.role = role
        self.border_title = role
        self._composed = False
        self._pending: FleetReading | None = None  # a reading that came before its rows were composed
        self._tiers: tuple[dict[str, TierInfo], dict[str, int]] = ({}, {})  # the last reading's, for a resize
        self._flow: tuple[FlowInfo | None, bool] = (None, False)  # the last reading's, and whether P and D pools
        self._structured: dict[str, int] = {}  # the last reading's, for a resize

    def on_mount(self) -> None:
        # a pool that appears while the console runs (a switch to mixed) is shown a reading as it is mounted,
        # before its rows exist: it shows that one now
        self._composed = True
        if self._pending is not None:
            self.show(self._pending)

    def compose(self) -> ComposeResult:
        for metric, label in METRICS:
            with Horizontal(classes="metric-row"):
                yield Label(label, classes="metric-label", id=f"{self.role}-{metric}-label")
                kind = "compute" if metric == "mfu" else "bandwidth" if metric == "mbu" else "busy"
                yield UsageChart(id=f"{self.role}-{metric}", classes=kind)
        with Horizontal(classes="metric-row regret", id=f"{self.role}-regret-row") as regret:
            regret.display = False  # shown once the fleet has replayed a window (it needs a store)
            yield Label("", classes="regret-label", id=f"{self.role}-regret-label")
            yield UsageChart(id=f"{self.role}-regret", classes="regret")
        yield Label("", classes="verdict", id=f"{self.role}-verdict")
        for line in ("tiers", "structured"):  # shown once the fleet has KV tiers / the pool a structured request
            label = Label("", classes=line, id=f"{self.role}-{line}")
            label.display = False
            yield label

    def show(self, reading: FleetReading) -> None:
        if not self._composed:
            self._pending = reading
            return
        pool = reading.pools.get(self.role)
        count, queue = (pool.workers, pool.queue) if pool else (0, 0)
        drafts = f" · drafts kept {pool.spec_acceptance:.0%}" if pool and pool.spec_acceptance is not None else ""
        self.border_title = f"{self.role} · {count} worker{'s' if count != 1 else ''} · queue {queue}{drafts}"
        for metric, label in METRICS:
            value = percent(getattr(pool, metric) if pool else None)
            show_text(self.query_one(f"#{self.role}-{metric}-label", Label), f"{label[:4]:<5}{value:>8}", layout=False)
            self.query_one(f"#{self.role}-{metric}", UsageChart).series = tuple(reading.pool_series(self.role, metric))
        show_text(self.query_one(f"#{self.role}-verdict", Label), verdict(self.role, pool))
        regret = reading.status.split_regret if reading.status else None
        self.query_one(f"#{self.role}-regret-row").display = regret is not None
        if regret is not None:
            show_text(self.query_one(f"#{self.role}-regret-label", Label), regret_label(regret), layout=False)
            self.query_one(f"#{self.role}-regret", UsageChart).series = tuple(regret.series)
        if self.role == "decode":
            self._flow = (reading.status.flow if reading.status else None, "prefill" in reading.pools)
            self._show_flow()
        self._tiers = (reading.kv_tiers, pool.tier_tokens if pool else {})
        self._structured = pool.structured_requests if pool else {}
        self._show_lines()

    def _show_flow(self) -> None:
        """The decode pool's arrivals over the last minute on its bottom border (no line of its own)."""
        flow, disaggregated = self._flow
        text, warns = flow_line(flow, disaggregated, self.size.width - 6) if flow else ("", False)
        self.border_subtitle = text
        self.set_class(warns, "warn")

    def on_resize(self) -> None:
        if self._composed:
            self._show_lines()  # their form depends on the width: a reading may come before the layout
            if self.role == "decode":
                self._show_flow()

    def _show_lines(self) -> None:
        """The tiers' line and the structured requests', each hidden while it has nothing to say: a fleet without
        tiers, a pool without structured output, keeps its layout."""
        (tiers, served), structured, width = self._tiers, self._structured, self.content_size.width
        for line, text in (("tiers", tier_line(tiers, served, width) if tiers else ""),
                           ("structured", structured_line(structured, width) if structured else "")):
            label = self.query_one(f"#{self.role}-{line}", Label)
            label.display = bool(text)
            show_text(label, text)
