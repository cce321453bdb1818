"""`fleetctl plan` and `fleetctl classify` (from the metrics store: no fleet needs to run) and `fleetctl rebalance`
(against a running fleet: a dry run that lists the moves, or `--apply` followed like `migrate` and said in
`schemas.describe`'s sentence)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from fleetctl.console.cli.common import (
    JSON_OPTION,
    STORE_OPTION,
    TIMEOUT_OPTION,
    URL_OPTION,
    fail,
    fleet_errors,
    follow_operation,
    operation_output,
    store_path,
)
from fleetctl.console.client import FleetClient

if TYPE_CHECKING:
    from fleetctl.engine.server.schemas import FleetPlan, RebalancePreview


def plan(
    since: str = typer.Option("10m", "--since", help="Window of the store to fit and replay: 90s, 10m, 2h, 1d."),
    slo_ttft: str = typer.Option("2s", "--slo-ttft", help="Time-to-first-token objective: 2s, 200ms or 0.2."),
    slo_tpot: str = typer.Option("200ms", "--slo-tpot", help="Time-per-output-token objective."),
    devices: str = typer.Option("", "--devices", help="cpu:0,cpu:1,… or NxGPU for a what-if fleet, e.g. 8xH100 "
                                                      "(default: the fleet's devices, as the store shows them)."),
    trace: Path = typer.Option(None, "--trace", help="Replay this Mooncake trace (JSONL) instead of the "
                                                     "window's requests.", dir_okay=False),
    store: str = STORE_OPTION,
    as_json: bool = JSON_OPTION,
) -> None:
    """Recommended prefill:decode split: cost models fitted to the measured steps, every split replayed."""
    from fleetctl.engine.planner.durations import parse_window
    from fleetctl.engine.planner.plan import USER_ERRORS, PlanRequest, plan_from_store
    from fleetctl.engine.planner.simulator import SimRequest
    from fleetctl.engine.planner.slo import Slo
    from fleetctl.engine.planner.trace_file import read_mooncake
    from fleetctl.engine.server.schemas import FleetPlan

    try:
        replay = None if trace is None else tuple(
            SimRequest(r.arrival_s, r.input_length, r.output_length) for r in read_mooncake(trace))
        request = PlanRequest(Slo.parse(slo_ttft, slo_tpot), devices or None, replay)
        result = plan_from_store(store_path(store), parse_window(since), request)
    except USER_ERRORS as exc:
        raise fail(str(exc)) from None
    planned = FleetPlan.model_validate(result.as_json())
    print(json.dumps(planned.model_dump(mode="json")) if as_json else render_plan(planned))


def _equation(fit: dict[str, Any], unit: str) -> str:
    terms = [f"{value:.3g} s" if term == "1" else f"{value:.3g} s·{term}"
             for term, value in fit["coefficients"].items() if value > 0]
    return f"{fit['points']} {unit}, error {fit['error']:.1%}: {' + '.join(terms) or '0 s'}"


def render_plan(plan: FleetPlan) -> str:
    """A plan for a person: what it rests on, the candidates, the choice and why."""
    from fleetctl.engine.planner.durations import format_window
    from fleetctl.engine.planner.slo import Slo

    source = "the trace" if plan.source == "trace" else f"the store's last {format_window(plan.window_s)}"
    what_if = plan.what_if
    devices = f"{what_if['count']}x {what_if['gpu']} (what-if)" if what_if else ", ".join(plan.devices)
    fit = plan.fit
    slo = Slo(plan.slo.ttft_s, plan.slo.tpot_s).describe()
    lines = [f"plan for {devices}: {plan.requests} requests from {source}; SLOs {slo}",
             f"fit ({fit['device_kind']}) prefill step = {_equation(fit['prefill'], 'steps')}",
             f"fit ({fit['device_kind']}) decode step = {_equation(fit['decode'], 'decodes')}"]
    if fit["handoff"]:
        lines.append(f"fit ({fit['device_kind']}) handoff = {_equation(fit['handoff'], 'handoffs')}; "
                     f"{fit['handoff_bytes_per_token']:g} bytes per prompt token")
    lines += [f"note: {note}" for note in plan.notes]
    lines.append(f"{'layout':<14} {'goodput/s':>9} {'good':>9} {'TTFT p90':>9} {'TPOT p90':>9}  ")
    current = plan.current
    for c in plan.candidates:
        label = f"colocated {c.mixed}" if c.mixed else f"{c.prefill}:{c.decode}"
        mark = " (current)" if current and (c.prefill, c.decode, c.mixed) == (
            current.prefill, current.decode, current.mixed) else ""
        tpot = "-" if c.tpot_p90_s is None else f"{c.tpot_p90_s:.3f}s"
        lines.append(f"{label:<14} {c.goodput:>9.3f} {c.good_requests:>4}/{c.requests:<4} "
                     f"{c.ttft_p90_s:>8.3f}s {tpot:>9}{mark}")
    lines.append(f"recommended: {plan.reason}")
    return "\n".join(lines)


def rebalance(
    split: str = typer.Option(..., "--split", help="PREFILL:DECODE over the fleet's devices, e.g. 2:1."),
    apply: bool = typer.Option(False, "--apply", help="Do it (default: a dry run that lists the moves)."),
    force: bool = typer.Option(False, "--force", help="Recompute the moved workers' sessions on peers at once "
                                                      "instead of letting them finish."),
    url: str = URL_OPTION,
    as_json: bool = JSON_OPTION,
    timeout: float = TIMEOUT_OPTION,
) -> None:
    """Move the fleet to another prefill:decode split without losing a session (dry run unless --apply)."""
    with fleet_errors():
        client = FleetClient(url, timeout=30.0)
        if not apply:
            preview = client.rebalance_preview(split, force)
            print(json.dumps(preview.model_dump(mode="json")) if as_json else _dry_run(preview))
            return
        started = client.start("/fleet/rebalance", {"split": split, "apply": True, "force": force})
        op = follow_operation(client, started, timeout)
    print(operation_output(op, as_json, timeout))


def _dry_run(preview: RebalancePreview) -> str:
    if not preview.moves:
        return f"the fleet is already at {preview.split}: nothing to move"
    how = {"recompute": "are recomputed on peers at once",
           "move": "move live to peers of their role (a prefill worker's finish where they are)",
           "finish": "finish where they are (no new work meanwhile)"}[preview.evacuation]
    lines = [f"{preview.current} -> {preview.split}: {len(preview.moves)} worker(s) change role; "
             f"their sessions {how}"]
    lines += [f"  {m.worker} on {m.device}: {m.from_} -> {m.to} ({m.sessions} session(s))" for m in preview.moves]
    lines.append("dry run: add --apply to do it")
    return "\n".join(lines)


def classify(
    since: str = typer.Option("10m", "--since", help="Window: 90s, 10m, 2h, 1d."),
    store: str = STORE_OPTION,
    as_json: bool = JSON_OPTION,
) -> None:
    """Traffic by phase: share of model time in prefill vs decode, by prompt/output length bucket."""
    from fleetctl.engine.planner.durations import DurationError, parse_window
    from fleetctl.store.classify import classify as classify_window
    from fleetctl.store.db import open_db

    try:
        window_s = parse_window(since)
    except DurationError as exc:
        raise fail(str(exc)) from None
    path = store_path(store)
    if not path.exists():
        raise fail(f"no metrics store at {path} (run a fleet with `fleetctl serve` first, or pass --store)")
    db = open_db(path)
    try:
        result = classify_window(db, window_s).as_json()
    finally:
        db.close()
    if as_json:
        print(json.dumps(result))
        return
    print(f"window {result['window_s']:.0f}s  requests {result['requests']}  prefill {result['prefill_share']:.1%}"
          f"  decode {result['decode_share']:.1%}")
    print(f"prefill tokens: {result['prefill_cached_tokens']} cached, {result['prefill_computed_tokens']} computed "
          f"(prefix hit ratio {result['prefix_hit_ratio']:.1%}; cached tokens cost no model time)  "
          f"local prefills {result['local_prefills']}")
    print(f"{'prompt tokens':<14} {'output tokens':<14} {'requests':>8} {'prefill share':>14}")
    for b in result["buckets"]:
        print(f"{b['prompt_tokens']:<14} {b['output_tokens']:<14} {b['requests']:>8} {b['prefill_share']:>14.1%}")
