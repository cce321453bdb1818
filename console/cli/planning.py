"""`fleetctl plan` and `fleetctl classify` (from a metrics store file, so that no fleet needs to run, or asked of a
fleet, which reads its own: `fleet_to_ask` says which) and `fleetctl rebalance` (against a running fleet: a dry
run that lists the moves, or `--apply` followed like `migrate` and said in `schemas.describe`'s sentence)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from fleetctl.console.cli.common import (
    JSON_OPTION,
    REPORT_STORE_OPTION,
    REPORT_URL_OPTION,
    TIMEOUT_OPTION,
    URL_OPTION,
    existing_store,
    fail,
    fleet_to_ask,
    follow_operation,
    operation_output,
    store_path,
)
from fleetctl.console.client import FleetClient, Params

if TYPE_CHECKING:
    from fleetctl.engine.api.operation_results import RebalancePreview
    from fleetctl.engine.api.reports import FleetClassification, FleetPlan

PLAN_TIMEOUT_S = 120.0  # a fleet replays every split of a long window before it answers


def plan(
    since: str = typer.Option("10m", "--since", help="Window of the store to fit and replay: 90s, 10m, 2h, 1d."),
    slo_ttft: str = typer.Option("2s", "--slo-ttft", help="Time-to-first-token objective: 2s, 200ms or 0.2."),
    slo_tpot: str = typer.Option("200ms", "--slo-tpot", help="Time-per-output-token objective."),
    devices: str = typer.Option("", "--devices", help="cpu:0,cpu:1,… or NxGPU for a what-if fleet, e.g. 8xH100 "
                                                      "(default: the fleet's devices, as the store shows them)."),
    elastic: bool = typer.Option(False, "--elastic", help="Also rank layouts on fewer of the devices: of those within "
                                                          "5 % of the best goodput, the fewest devices win (a "
                                                          "fleet with free devices plans so by itself)."),
    trace: Path = typer.Option(None, "--trace", help="Replay this Mooncake trace (JSONL) instead of the "
                                                     "window's requests (from a store file only).",
                                 dir_okay=False),
    store: str = REPORT_STORE_OPTION,
    url: str | None = REPORT_URL_OPTION,
    as_json: bool = JSON_OPTION,
) -> None:
    """Recommended prefill:decode split: cost models fitted to the measured steps, every split replayed (from a
    store file, or asked of a fleet)."""
    fleet = fleet_to_ask(store, url)
    if fleet is None:
        planned = _plan_from_file(store_path(store), since, slo_ttft, slo_tpot, devices, trace, elastic)
    elif trace is not None:
        raise fail("--trace replays a file on this machine: plan it from a store file (--store), not from a fleet")
    else:
        query: Params = {"since": since, "slo_ttft": slo_ttft, "slo_tpot": slo_tpot}
        if devices:
            query["devices"] = devices
        if elastic:
            query["elastic"] = "true"
        planned = FleetClient(fleet, timeout=PLAN_TIMEOUT_S).plan(query)
    print(json.dumps(planned.model_dump(mode="json")) if as_json else render_plan(planned))


def _plan_from_file(path: Path, since: str, slo_ttft: str, slo_tpot: str, devices: str,
                    trace: Path | None, elastic: bool) -> FleetPlan:
    from fleetctl.engine.api.reports import FleetPlan
    from fleetctl.engine.api.trace_file import read_mooncake
    from fleetctl.engine.planner.durations import parse_window
    from fleetctl.engine.planner.plan import PlanRequest, plan_from_store
    from fleetctl.engine.planner.simulator import SimRequest
    from fleetctl.engine.planner.slo import Slo

    replay = None if trace is None else tuple(
        SimRequest(r.arrival_s, r.input_length, r.output_length) for r in read_mooncake(trace))
    request = PlanRequest(Slo.parse(slo_ttft, slo_tpot), devices or None, replay, elastic=elastic)
    result = plan_from_store(path, parse_window(since), request)
    return FleetPlan.model_validate(result.as_json())


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
    if plan.elastic:
        devices += " (elastic: layouts on any number of them)"
    lines = [f"plan for {devices}: {plan.requests} requests from {source}; SLOs {slo}",
             f"fit ({fit['device_kind']}) prefill step = {_equation(fit['prefill'], 'steps')}",
             f"fit ({fit['device_kind']}) decode step = {_equation(fit['decode'], 'decodes')}"]
    if fit["handoff"]:
        lines.append(f"fit ({fit['device_kind']}) handoff = {_equation(fit['handoff'], 'handoffs')}; "
                     f"{fit['handoff_bytes_per_token']:g} bytes per prompt token")
    lines += [f"note: {note}" for note in plan.notes]
    lines.append(f"{'layout':<14} {'goodput/s':>9} {'band/s':>13} {'good':>9} {'TTFT p90':>9} {'TPOT p90':>9}  ")
    current = plan.current
    for c in plan.candidates:
        label = f"colocated {c.mixed}" if c.mixed else f"{c.prefill}:{c.decode}"
        mark = " (current)" if current and (c.prefill, c.decode, c.mixed) == (
            current.prefill, current.decode, current.mixed) else ""
        tpot = "-" if c.tpot_p90_s is None else f"{c.tpot_p90_s:.3f}s"
        band = f"{c.goodput_band[0]:.3f}–{c.goodput_band[1]:.3f}" if c.goodput_band else "-"
        lines.append(f"{label:<14} {c.goodput:>9.3f} {band:>13} {c.good_requests:>4}/{c.requests:<4} "
                     f"{c.ttft_p90_s:>8.3f}s {tpot:>9}{mark}")
    lines.append(f"recommended: {plan.reason}")
    if plan.advice and plan.advice.verdict != "unknown":  # unknown: no current layout to weigh it against
        lines.append(f"advice: {plan.advice.sentence}")
    return "\n".join(lines)


def rebalance(
    split: str = typer.Option(..., "--split", help="PREFILL:DECODE, e.g. 2:1; PREFILL:DECODE:MIXED, e.g. "
                                                   "1:1:1; or 'colocated N'. More workers than the fleet runs "
                                                   "start on free devices of `serve --devices`; fewer stop the "
                                                   "idlest (sessions moved live first)."),
    apply: bool = typer.Option(False, "--apply", help="Do it (default: a dry run that lists the moves)."),
    force: bool = typer.Option(False, "--force", help="Recompute the moved workers' sessions on peers at once "
                                                      "instead of letting them finish (implies --via restart)."),
    via: str | None = typer.Option(None, "--via", help="switch: each worker re-lays itself in place, the same "
                                                       "process (default); restart: it is stopped and a new one "
                                                       "started (the default when the roles' weight formats differ)."),
    url: str = URL_OPTION,
    as_json: bool = JSON_OPTION,
    timeout: float = TIMEOUT_OPTION,
) -> None:
    """Move the fleet to another layout without losing a session (dry run unless --apply)."""
    client = FleetClient(url, timeout=30.0)
    if not apply:
        preview = client.rebalance_preview(split, force, via)
        print(json.dumps(preview.model_dump(mode="json")) if as_json else _dry_run(preview))
        return
    started = client.start("/fleet/rebalance", {"split": split, "apply": True, "force": force, "via": via})
    op = follow_operation(client, started, timeout)
    print(operation_output(op, as_json, timeout))


def _dry_run(preview: RebalancePreview) -> str:
    if not (preview.moves or preview.starts or preview.stops):
        return f"the fleet is already at {preview.split}: nothing to move"
    how = {"recompute": "are recomputed on peers at once",
           "move": "move live to peers that decode (a prefill worker's finish where they are)",
           "finish": "finish where they are (no new work meanwhile)"}[preview.evacuation]
    change = "in place (the same process)" if preview.via == "switch" else "by restart (a new process)"
    steps = [f"{len(preview.moves)} worker(s) change role {change}"]
    steps += [f"{len(group)} {verb}" for group, verb in ((preview.starts, "start on free devices"),
                                                          (preview.stops, "stop")) if group]
    lines = [f"{preview.current} -> {preview.split}: {', '.join(steps)}; their sessions {how}"]
    lines += [f"  {s.describe()}" for s in preview.starts]
    lines += [f"  {m.worker} on {m.device}: {m.from_} -> {m.to} ({m.sessions} session(s))" for m in preview.moves]
    lines += [f"  {s.describe()}" for s in preview.stops]
    lines.append("dry run: add --apply to do it")
    return "\n".join(lines)


def classify(
    since: str = typer.Option("10m", "--since", help="Window: 90s, 10m, 2h, 1d."),
    store: str = REPORT_STORE_OPTION,
    url: str | None = REPORT_URL_OPTION,
    as_json: bool = JSON_OPTION,
) -> None:
    """Traffic by phase: share of model time in prefill vs decode, by prompt/output length bucket (from a store
    file, or asked of a fleet)."""
    fleet = fleet_to_ask(store, url)
    classified = _classify_file(store, since) if fleet is None else FleetClient(fleet).classify({"since": since})
    print(json.dumps(classified.model_dump(mode="json")) if as_json else render_classification(classified))


def _classify_file(store: str, since: str) -> FleetClassification:
    from fleetctl.engine.api.reports import FleetClassification
    from fleetctl.engine.planner.durations import parse_window
    from fleetctl.store.classify import classify as classify_window
    from fleetctl.store.db import read_store

    window_s = parse_window(since)
    path = existing_store(store, "run a fleet with `fleetctl serve` first, or pass --store")
    classified = read_store(path, lambda db: classify_window(db, window_s))
    return FleetClassification.model_validate(classified.as_json())


def render_classification(classified: FleetClassification) -> str:
    """The shares for a person: overall, the prompt tokens behind them, then by length bucket."""
    c = classified
    lines = [f"window {c.window_s:.0f}s  requests {c.requests}  prefill {c.prefill_share:.1%}  "
             f"decode {c.decode_share:.1%}",
             f"prefill tokens: {c.prefill_cached_tokens} cached, {c.prefill_computed_tokens} computed (prefix hit "
             f"ratio {c.prefix_hit_ratio:.1%}; cached tokens cost no model time)  local prefills {c.local_prefills}"]
    if c.tier_tokens:
        lines.append("of the cached, read back from KV tiers: " + ", ".join(
            f"{tier} {tokens}" for tier, tokens in sorted(c.tier_tokens.items())))
    lines += [f"{'prompt tokens':<14} {'output tokens':<14} {'requests':>8} {'prefill share':>14}"]
    lines += [f"{b.prompt_tokens:<14} {b.output_tokens:<14} {b.requests:>8} {b.prefill_share:>14.1%}"
              for b in c.buckets]
    return "\n".join(lines)
