"""`fleetctl demo`: an embedded fleet (or the one at --url), synthetic traffic that swings between a
prompt-heavy and a decode-heavy phase, and either the console or, headless, a summary of what the
fleet did in each phase."""

import functools
import json
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import typer

from fleetctl.console.cli.common import QUANTIZATION_OPTION, fail, store_path
from fleetctl.console.cli.embedded import embedded_fleet
from fleetctl.domain import Quantization
from fleetctl.engine.model.registry import DEFAULT_MODEL

if TYPE_CHECKING:
    from fleetctl.console.demo.tour import TourStep
    from fleetctl.console.demo.traffic import DemoTraffic, PhaseLog


@dataclass(frozen=True)
class DemoRun:
    store: Path  # the metrics store the fleet writes
    phase_seconds: float
    duration: float  # headless only
    as_json: bool
    console: Callable[..., None] | None  # run_console on the interactive path, else None (headless)
    tour_pause_s: float | None = None  # --tour: seconds between its steps; None: no tour


def demo(
    model: str = typer.Option(DEFAULT_MODEL, "--model", "-m", help="Store name or Hugging Face directory of "
                                                                   "the embedded fleet's model."),
    headless: bool = typer.Option(False, "--headless", help="No console: run --duration seconds, print a summary."),
    duration: float = typer.Option(60.0, "--duration", min=1.0, help="Seconds of traffic when headless."),
    phase_seconds: float = typer.Option(30.0, "--phase-seconds", min=1.0, help="Seconds per traffic phase."),
    url: str = typer.Option(None, "--url", help="Drive the fleet at this URL instead of starting one."),
    store: str = typer.Option("", "--store", help="The metrics store the fleet writes (default "
                                                  "$FLEET_HOME/fleet.db)."),
    as_json: bool = typer.Option(False, "--json", help="Headless: one JSON object on stdout."),
    quantization: Quantization = QUANTIZATION_OPTION,
    tour: bool = typer.Option(False, "--tour", help="Perform, announce and check what the fleet can do while the "
                                                    "traffic streams: a live migration, a role switch, a checkpoint "
                                                    "and restore, a worker killed, a rebalance to the planner's "
                                                    "layout. Headless it runs until the tour ends (at least "
                                                    "--duration) and reports each step."),
    tour_pause: float = typer.Option(10.0, "--tour-pause", min=0.0, help="Seconds between the tour's steps."),
) -> None:
    r"""Embedded fleet + synthetic traffic + console: the default model on all local devices (one worker
    per GPU: 1 prefill + the rest decode, on one GPU two slots of it; without GPUs 1 prefill + 2 decode CPU
    slots), driven by
    streamed completions that alternate every --phase-seconds between a rag-like phase (long prompts,
    short answers) and an agent-like phase (short prompts, long answers). In the console press ? for
    its keys, q to quit.

    Headless (--headless, or no terminal on stdout) it runs --duration
    seconds and prints a summary read from the metrics store; --json
    prints it as one object:

    {"model", "url", "embedded", "phase_seconds", "duration_s",
     "requests", "completed", "errors", "cancelled",
     "pools": {ROLE: {"workers", "busy", "mfu", "mbu"}},
     "phases": \[{"index", "kind": "rag"|"agent", "start_s", "end_s",
       "prompt_tokens": \[lo, hi], "output_tokens": \[lo, hi],
       "requests", "completed", "errors", "cancelled", "arrival_rate",
       "prefill_share", "decode_share", "pools": {ROLE: {...}}}],
     "by_kind": {KIND: {"phases", "requests", "prefill_share",
       "decode_share"}},
     "ttft_s": {"p50", "p99"}, "tpot_s": {"p50", "p99"},
     "handoffs": {"count", "bytes", "seconds", "share_of_e2e"},
     "first_error", "tour": \[{"name", "ok", "seconds", "result"}] (with --tour)}

    Shares are of model time (each request's part of its workers' busy
    time) over the requests that arrived in the phase; busy, mfu and mbu
    are means over the run (or the phase)."""
    interactive = not headless and sys.stdout.isatty()
    if not headless and not interactive:
        print(f"fleetctl: no terminal on stdout: running headless for {duration:.0f} s", file=sys.stderr)
    run = DemoRun(store_path(store), phase_seconds, duration, as_json, _console() if interactive else None,
                  tour_pause if tour else None)
    if url:
        if not interactive and not run.store.exists():
            raise fail(f"no metrics store at {run.store}: pass --store with the store the fleet at {url} writes")
        _drive(run, url.rstrip("/"), embedded=False)
        return
    if sys.stderr.isatty():
        print(f"fleetctl: starting an embedded fleet of {model}…", file=sys.stderr)
    with embedded_fleet(model, run.store, quantization) as embedded:
        _drive(run, embedded, embedded=True)


def _console() -> Callable[..., None]:
    from fleetctl.console.tui.app import run_console  # Textual: never imported on the headless path
    from fleetctl.engine.metrics.gpu_sampler import GpuSampler

    return functools.partial(run_console, gpus=GpuSampler())


def _drive(run: DemoRun, url: str, *, embedded: bool) -> None:
    """The traffic against `url`, under the console or for `run.duration` seconds (with a tour, until it ended);
    then the summary."""
    from fleetctl.console.demo.traffic import DemoTraffic, plan_traffic

    model, config = plan_traffic(url, run.phase_seconds)
    traffic = DemoTraffic(url, model, config)
    touring = run.tour_pause_s is not None and run.console is None
    traffic.start(None if run.console or touring else run.duration)
    if run.console is None and sys.stderr.isatty():
        print(f"fleetctl: demo traffic on {url} for {run.duration:.0f} s…", file=sys.stderr)
    tour = None
    try:
        if run.console is not None:
            run.console(url, embedded=embedded, store=run.store if run.store.exists() else None, readonly=False,
                        title=f"fleetctl demo · {model}", tour=_tour_runner(url, run.tour_pause_s))
            return
        if touring:
            tour = _headless_tour(url, run)
        else:
            traffic.wait()
    finally:
        phases = traffic.stop()
    header = {"model": model, "url": url, "embedded": embedded, "phase_seconds": run.phase_seconds}
    _report(run, traffic, phases, header, tour)


def _tour_runner(url: str, pause_s: float | None) -> "Callable[[Callable[[str], None]], object] | None":
    """What the console runs in a thread once it is on screen: the tour, announcing through its argument."""
    if pause_s is None:
        return None
    from fleetctl.console.client import FleetClient
    from fleetctl.console.demo.tour import Tour

    return lambda announce: Tour(FleetClient(url), announce, pause_s).run()


def _headless_tour(url: str, run: DemoRun) -> "list[TourStep]":
    """The tour, each announcement a line on stderr, then the rest of --duration."""
    import threading
    import time

    from fleetctl.console.client import FleetClient
    from fleetctl.console.demo.tour import Tour

    started = time.monotonic()
    tour = Tour(FleetClient(url), lambda text: print(f"fleetctl tour: {text}", file=sys.stderr, flush=True),
                run.tour_pause_s or 0.0)
    thread = threading.Thread(target=tour.run, name="demo-tour", daemon=True)
    thread.start()
    try:
        while thread.is_alive() or time.monotonic() - started < run.duration:
            thread.join(0.2)
    finally:
        tour.stopped.set()  # Ctrl-C: the step under way ends the tour
    return tour.steps


def _report(run: DemoRun, traffic: "DemoTraffic", phases: list["PhaseLog"], header: dict[str, object],
            tour: "list[TourStep] | None" = None) -> None:
    from fleetctl.console.demo.summary import demo_summary, render_summary, wait_for_store
    from fleetctl.store.db import open_db

    if not any(p.completed for p in phases):
        raise fail(f"no demo request succeeded: {traffic.first_error or 'none was sent'}")
    db = open_db(run.store)
    try:
        wait_for_store(db, phases)
        summary = demo_summary(db, phases, traffic.schedule.shapes, header, traffic.first_error)
    finally:
        db.close()
    if tour is not None:
        summary["tour"] = [step.as_json() for step in tour]
    print(json.dumps(summary) if run.as_json else "\n".join(render_summary(summary)))
    failed = [step.name for step in tour or [] if not step.ok]
    if failed:
        raise fail(f"the tour's {', '.join(failed)} step(s) failed (the summary says why)")
