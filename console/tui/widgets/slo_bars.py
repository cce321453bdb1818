"""The plan screen's picture of each replayed layout's latency against the SLOs: per layout, its TTFT p90 and TPOT
p90 as bars scaled to the SLO — the mark in the middle of each bar is the SLO, a bar runs to twice it — green where
the p90 meets the SLO, red past it, so the layouts that break a target stand out before their numbers are read."""

from rich.text import Text
from textual.widgets import Static

from fleetctl.engine.api.reports import FleetPlan, PlanCandidate, layout_label

EIGHTHS = " ▏▎▍▌▋▊▉█"
SCALE = 2.0  # a full bar is twice the SLO
LABEL_W, NUMBER_W = 12, 9  # "colocated 3 ", " 0.46×  "
MIN_BAR = 8


def bar(ratio: float, width: int) -> Text:
    """`width` cells of a bar `ratio` (p90 / SLO) long on a scale of SCALE, the SLO marked at its middle."""
    eighths = round(min(ratio, SCALE) / SCALE * width * 8)
    mark = width // 2
    text = Text()
    for cell in range(width):
        filled = min(8, max(0, eighths - 8 * cell))
        over = cell >= mark
        if filled:
            text.append(EIGHTHS[filled], style="red" if over and ratio > 1 else "green")
        else:
            text.append("│" if cell == mark else " ", style="dim")
    return text


def ratio_text(value: float | None, slo: float) -> tuple[float | None, str]:
    if value is None:
        return None, "-"
    ratio = value / slo
    return ratio, f"{ratio:.2f}×"


def layout_line(candidate: PlanCandidate, plan: FleetPlan, width: int) -> Text:
    """`3:3  TTFT ██████▌   │      0.46×  TPOT ███▎     │      0.41×` in `width` cells."""
    bar_w = max(MIN_BAR, (width - LABEL_W - 2 * (5 + NUMBER_W)) // 2)
    line = Text(f"{layout_label(candidate.prefill, candidate.decode, candidate.mixed):<{LABEL_W}}")
    for name, value, slo in (("TTFT", candidate.ttft_p90_s, plan.slo.ttft_s),
                             ("TPOT", candidate.tpot_p90_s, plan.slo.tpot_s)):
        ratio, number = ratio_text(value, slo)
        line.append(f"{name} ")
        line.append_text(bar(ratio, bar_w) if ratio is not None else Text(" " * bar_w))
        line.append(f" {number:>{NUMBER_W - 3}}  ", style="bold red" if ratio is not None and ratio > 1 else "")
    return line


class SloBars(Static):
    """Shown once a plan arrives (`show`); drawn to the widget's width."""

    plan: FleetPlan | None = None

    def show(self, plan: FleetPlan | None) -> None:
        self.plan = plan
        self.refresh()

    def render(self) -> Text:
        plan = self.plan
        if plan is None:
            return Text("")
        width = self.content_size.width or 80
        slo = plan.slo
        heading = Text(f"p90 against the SLOs (TTFT ≤ {slo.ttft_s:g} s, TPOT ≤ {slo.tpot_s * 1000:g} ms): the mark is "
                       f"the SLO, a full bar twice it", style="dim")
        return Text("\n").join([heading, *(layout_line(c, plan, width) for c in plan.candidates)])
