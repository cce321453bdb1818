"""The plan screen's latency picture: a bar per layout and SLO, scaled so the SLO sits at the middle mark, red
past it; a layout with no TPOT (one-token answers) draws none."""

from support.console_fixture import PLAN

from fleetctl.console.tui.widgets.slo_bars import bar, layout_line


def test_a_bar_marks_the_slo_at_its_middle_and_turns_red_past_it() -> None:
    under = bar(0.5, 20)  # half the SLO: a quarter of the bar, the mark still showing
    assert under.plain == "█████     │         " and {span.style for span in under.spans if "█" in
                                                     under.plain[span.start:span.end]} == {"green"}
    over = bar(1.5, 20)  # past the SLO: the cells beyond the mark are red
    assert over.plain == "█" * 15 + " " * 5
    assert [over.plain[s.start:s.end] for s in over.spans if s.style == "red"] == ["█"] * 5
    assert bar(9.0, 8).plain == "█" * 8  # clipped at twice the SLO


def test_each_layout_line_shows_both_ratios_and_flags_the_broken_slo() -> None:
    worst = next(c for c in PLAN.candidates if c.layout == "1:5")  # TTFT p90 9.7 s against a 2 s SLO
    line = layout_line(worst, PLAN, 100)
    assert line.plain.startswith("1:5         TTFT ") and "4.85×" in line.plain and "0.29×" in line.plain
    assert any(span.style == "bold red" and "4.85×" in line.plain[span.start:span.end] for span in line.spans)
    one_token = worst.model_copy(update={"tpot_p90_s": None})
    assert layout_line(one_token, PLAN, 100).plain.rstrip().endswith("-")
