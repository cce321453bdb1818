"""`fleetctl bench`: the load generator (console/loadgen) against a running fleet, or with `--compare-layouts`
against two fleets it starts itself; one table, or `--json`, or `--save`d per request."""

import json
from pathlib import Path

import typer

from fleetctl.console.cli.common import (
    JSON_OPTION,
    URL_OPTION,
    ProgressCallback,
    fail,
    stage_progress,
)
from fleetctl.console.cli.models import resolve_model
from fleetctl.console.client import FleetClient, FleetClientError, FleetRefused, fleet_url
from fleetctl.console.loadgen.agent_tools import AgentApi
from fleetctl.console.loadgen.requests import TraceRequest
from fleetctl.console.loadgen.synthetic import TraceKind
from fleetctl.engine.model.registry import DEFAULT_MODEL
from fleetctl.errors import UserError


def bench(
    url: str = URL_OPTION,
    trace: str = typer.Option(TraceKind.CHAT.value, "--trace", help="chat, rag, agent (multi-turn sessions), shift, "
                                                                    "or a trace file (JSONL: sessions or Mooncake, "
                                                                    "replayed whole)."),
    requests: int = typer.Option(32, "--requests", min=1, help="Requests to send."),
    rate: float = typer.Option(4.0, "--rate", min=0.0, help="Poisson arrivals per second (0: all at once)."),
    slo_ttft: float = typer.Option(2.0, "--slo-ttft", min=0.0, help="TTFT objective, seconds."),
    slo_tpot: float = typer.Option(0.2, "--slo-tpot", min=0.0, help="Time-per-output-token objective, seconds."),
    seed: int = typer.Option(0, "--seed"),
    tool_time: float = typer.Option(0.0, "--tool-time", min=0.0, help="Agent sessions: the mean seconds of a "
                                    "tool call, waited between a turn's end and the next turn (0: none)."),
    tools: bool = typer.Option(False, "--tools", help="Agent sessions speak the chat API with four function tools "
                               "(real JSON schemas): each turn a call (`tool_choice: required`) answered by a `tool` "
                               "message, the last turn a free answer; adds the schema-valid rate and constrained vs "
                               "free TPOT."),
    response_format: bool = typer.Option(False, "--response-format", help="Agent sessions speak the chat API, each "
                                         "turn but the last asking for a ReAct step as `response_format` json_schema; "
                                         "adds the schema-valid rate and constrained vs free TPOT."),
    compare_layouts: bool = typer.Option(False, "--compare-layouts", help="Start the fleets itself: colocated on "
                                         "--devices, then the split `plan` picks from that run; their goodput ratio."),
    model: str = typer.Option(DEFAULT_MODEL, "--model", "-m", help="With --compare-layouts: the model to serve."),
    devices: str = typer.Option("", "--devices", help="With --compare-layouts: the devices both layouts use "
                                                      "(default: every GPU, or cpu:0,cpu:1,cpu:2)."),
    store_dir: str = typer.Option("", "--store-dir", help="With --compare-layouts: keep the runs' stores here "
                                                          "(colocated.db, split.db) for `plan --store`."),
    input_len: int = typer.Option(0, "--input-len", min=0, help="Every prompt exactly this many tokens (random "
                                                                "words; 0: the trace's lengths)."),
    output_len: int = typer.Option(0, "--output-len", min=0, help="Every answer exactly this many tokens "
                                                                  "(0: the trace's lengths)."),
    max_concurrency: int = typer.Option(0, "--max-concurrency", min=0,
                                        help="At most this many requests in flight (0: no cap)."),
    warmup: int = typer.Option(0, "--warmup", min=0, help="Send this many requests first, unmeasured."),
    save: str = typer.Option("", "--save", help="Also write the results and every request's numbers to this "
                                                "JSON file."),
    as_json: bool = JSON_OPTION,
) -> None:
    """Load generator against a running fleet: requests/s, input and output tokens/s, TTFT/TPOT/E2E
    percentiles, goodput under the SLOs, KV handoff share."""
    import asyncio
    import contextlib

    import httpx

    from fleetctl.console.loadgen.outcome import Outcome
    from fleetctl.console.loadgen.report import print_results, save_results
    from fleetctl.console.loadgen.runner import fixed_lengths, run_bench
    from fleetctl.console.loadgen.traces import load_trace

    api = _agent_api(trace, tools, response_format, input_len, compare_layouts)
    target = fleet_url(url)
    context = _context_of(target) if trace == TraceKind.AGENT and not compare_layouts else None
    name, requests_ = load_trace(trace, requests, rate, seed, context, tool_time)
    if compare_layouts:
        _compare_layouts(model, devices, name, requests_, slo_ttft, slo_tpot, store_dir, as_json)
        return
    with contextlib.suppress(FleetRefused):  # a fleet that answers at all is benched
        FleetClient(target).get("/health")

    async def run(progress: ProgressCallback | None) -> dict:
        async with httpx.AsyncClient(base_url=target, timeout=60.0) as http:
            trace_ = await fixed_lengths(http, requests_, input_len, output_len, seed)
        return await run_bench(target, trace_, name, slo_ttft, slo_tpot, max_concurrency=max_concurrency,
                               warmup=warmup, progress=progress, details=outcomes, api=api)

    outcomes: list[Outcome] = []
    try:
        with stage_progress("bench") as progress:
            result = asyncio.run(run(progress)) | {"input_len": input_len or None, "output_len": output_len or None}
        if save:
            save_results(Path(save), result, outcomes)
    except (httpx.HTTPError, OSError, ValueError, KeyError) as exc:
        raise fail(f"bench failed against {target}: {exc.__class__.__name__}: {exc}") from None
    if as_json:
        print(json.dumps(result))
        return
    print_results(result)


def _agent_api(trace: str, tools: bool, response_format: bool, input_len: int, compare_layouts: bool) -> AgentApi:
    """How agent sessions' turns are sent, or one error line for options that do not go together."""
    if not (tools or response_format):
        return AgentApi.COMPLETIONS
    flag = "--tools" if tools else "--response-format"
    if tools and response_format:
        raise fail("give one of --tools and --response-format")
    if trace != TraceKind.AGENT:
        raise fail(f"{flag} is for --trace agent (synthetic agent sessions), not {trace!r}")
    if input_len or compare_layouts:
        other = "--input-len" if input_len else "--compare-layouts"
        raise fail(f"{flag} sends chat messages: it does not go with {other}")
    return AgentApi.TOOLS if tools else AgentApi.RESPONSE_FORMAT


def _context_of(url: str) -> int | None:
    """The served model's context (`max_model_len` in /v1/models), which agent sessions are sized to; None
    when the fleet does not say (the sessions then assume an 8k context)."""
    try:
        return FleetClient(url).get("/v1/models")["data"][0].get("max_model_len")
    except (FleetClientError, KeyError, IndexError):
        return None


def _compare_layouts(model: str, devices: str, name: str, trace: list[TraceRequest], slo_ttft: float,
                     slo_tpot: float, store_dir: str, as_json: bool) -> None:
    """What `bench --compare-layouts` prints, or one error line."""
    from fleetctl.console.cli.compare_layouts import compare_layouts, default_devices, render_comparison
    from fleetctl.console.loadgen.local_fleet import FleetStartError
    from fleetctl.engine.planner.slo import Slo

    chosen = [d.strip() for d in devices.split(",") if d.strip()] or default_devices()
    slo = Slo(slo_ttft, slo_tpot)
    model_dir = resolve_model(model)
    try:
        result = compare_layouts(str(model_dir), chosen, trace, name, slo,
                                 Path(store_dir).expanduser() if store_dir else None)
    except FleetStartError as exc:
        raise fail(f"a fleet did not start: {exc.reason}") from None
    except UserError as exc:  # what the plan between the two runs refused with
        raise fail(f"no split to compare with: {exc}") from None
    print(json.dumps(result) if as_json else render_comparison(result))
