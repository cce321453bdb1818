"""`fleetctl serve`, `status`, `workers`."""

import errno
import json
import os
import re
import socket
import sys
from collections.abc import Callable
from pathlib import Path

import typer

from fleetctl.console.client import FleetClient, FleetClientError
from fleetctl.console.errors import fail, user_errors
from fleetctl.console.models_cmd import resolve_model
from fleetctl.console.traces import TraceKind
from fleetctl.engine.core.config import CompileMode, DType
from fleetctl.engine.fleet.config import DEFAULT_LOCAL_PREFILL_TOKENS
from fleetctl.engine.model.registry import DEFAULT_MODEL


def serve(
    model: str = typer.Option(DEFAULT_MODEL, "--model", "-m", help="Store name or Hugging Face directory."),
    prefill: int = typer.Option(1, "--prefill", help="Prefill workers."),
    decode: int = typer.Option(1, "--decode", help="Decode workers."),
    colocated: int = typer.Option(0, "--colocated", help="Baseline: N mixed workers, no handoff."),
    devices: str = typer.Option("", "--devices", help="cuda:0,cuda:1,… or cpu:0,cpu:1,… one per worker."),
    host: str = typer.Option("127.0.0.1", "--host"),
    port: int = typer.Option(8700, "--port", help="0 picks a free port (printed)."),
    dtype: DType = typer.Option(DType.AUTO, "--dtype", help="auto: bf16 on GPUs and CPUs with native bf16, else fp32."),
    deterministic: bool = typer.Option(False, "--deterministic", help="Batch-invariant numerics in every worker."),
    prefix_cache: bool = typer.Option(True, "--prefix-cache/--no-prefix-cache",
                                      help="Reuse the KV of prompts' shared leading blocks (on by default)."),
    local_prefill_tokens: int = typer.Option(
        DEFAULT_LOCAL_PREFILL_TOKENS, "--local-prefill-tokens", min=0,
        help="A decode worker caching part of a prompt prefills it itself (no handoff) when at most this many of "
             "its tokens are uncached there; 0: always the prefill pool."),
    kv_memory: int = typer.Option(0, "--kv-memory", min=0, help="Cap each worker's KV pool, MiB (0: from memory)."),
    kv_blocks: int = typer.Option(0, "--kv-blocks", min=0, help="Exact KV blocks per worker (overrides --kv-memory)."),
    store: str = typer.Option("", "--store", help="SQLite metrics store (default $FLEET_HOME/fleet.db)."),
    max_queue: int = typer.Option(256, "--max-queue", min=0,
                                  help="Requests waiting to generate (queued, prefilling, KV awaiting a decode "
                                       "worker) beyond this get HTTP 429 with Retry-After."),
    max_num_seqs: int = typer.Option(64, "--max-num-seqs", min=1, help="Sequences per worker batch."),
    max_num_batched_tokens: int = typer.Option(4096, "--max-num-batched-tokens", min=16,
                                               help="Prompt tokens one step computes: a longer prompt is prefilled "
                                                    "in chunks (between them a mixed worker decodes)."),
    max_model_len: int = typer.Option(0, "--max-model-len", min=0,
                                      help="Cap on prompt + output tokens (0: the model's context)."),
    compile_mode: CompileMode = typer.Option(
        CompileMode.OFF, "--compile", envvar="FLEET_COMPILE",
        help="on: decode workers compile their decode step once per batch bucket at start (inductor; not with "
             "--deterministic)."),
    served_model_name: str = typer.Option("", "--served-model-name", help="The model name clients use "
                                                                          "(default: the model's store name)."),
    api_key: str = typer.Option("", "--api-key", envvar="FLEET_API_KEY",
                                help="Require `Authorization: Bearer KEY` on /v1/* (also $FLEET_API_KEY)."),
    access_log: bool = typer.Option(True, "--access-log/--no-access-log", help="One line per HTTP request."),
    grace: float = typer.Option(30.0, "--grace", min=0.0, help="On SIGTERM/SIGINT: seconds requests in flight "
                                                                "get to finish (new ones get 503) before the rest "
                                                                "end with an error and the workers stop."),
    restart: bool = typer.Option(True, "--restart/--no-restart", help="Restart workers that die (with backoff)."),
    heartbeat_timeout: float = typer.Option(10.0, "--heartbeat-timeout", min=0.1,
                                            help="Seconds of silence after which a worker counts as hung and is "
                                                 "killed (its sessions recomputed, the worker restarted)."),
    step_timeout: float = typer.Option(120.0, "--step-timeout", min=0.1,
                                       help="Seconds: one model step running longer counts as hung."),
    checkpoint_timeout: float = typer.Option(300.0, "--checkpoint-timeout", min=0.1,
                                             help="Seconds: a checkpoint not written by then is called off; "
                                                  "the worker serves on."),
    autoplan: bool = typer.Option(False, "--autoplan", help="Plan every interval and rebalance when the gain holds."),
    autoplan_interval: float = typer.Option(60.0, "--autoplan-interval", min=1.0, help="Seconds per autoplan window."),
    min_gain: float = typer.Option(10.0, "--min-gain", min=0.0, help="Predicted goodput gain (%) autoplan needs, "
                                                                     "two windows in a row."),
    autoplan_slo: str = typer.Option("2s,200ms", "--autoplan-slo", help="TTFT,TPOT objectives autoplan's goodput "
                                                                        "counts against."),
    ray: str = typer.Option("", "--ray", metavar="[ADDRESS]",
                            help="Workers as Ray actors: no value or `auto` (this machine's Ray, started if none "
                                 "runs), or a cluster's address. Devices may name a node: node2/cpu:0, node2/cuda:0."),
) -> None:
    """Run a fleet and its HTTP server in the foreground (a stats line every 10 s on stderr)."""
    import logging

    import uvicorn

    os.umask(0o077)  # everything the fleet writes (store, checkpoints, handoff buffers, token) is the user's alone

    from fleetctl.engine.core.config import EngineSettings
    from fleetctl.engine.fleet.config import FleetConfig, FleetConfigError, Supervision
    from fleetctl.engine.fleet.controller import Fleet
    from fleetctl.engine.planner.autoplan_settings import AutoplanSettings
    from fleetctl.engine.planner.durations import DurationError
    from fleetctl.engine.planner.slo import Slo
    from fleetctl.engine.server.admin_auth import AdminTokenError, load_or_create_admin_token
    from fleetctl.engine.server.app import create_app
    from fleetctl.engine.server.graceful import GracefulServer

    listener = bind(host, port)  # first: a taken port fails in milliseconds, before a model is even looked at
    with user_errors(on_error=listener.close):
        try:
            engine = EngineSettings(dtype=dtype, deterministic=deterministic, max_num_seqs=max_num_seqs,
                                    max_num_batched_tokens=max_num_batched_tokens,
                                    kv_memory_bytes=kv_memory * 2**20 or None, num_kv_blocks=kv_blocks or None,
                                    max_model_len=max_model_len or None, prefix_cache=prefix_cache,
                                    compile=compile_mode)
            config = FleetConfig(
                model_dir=resolve_model(model), prefill=prefill, decode=decode, colocated=colocated,
                devices=tuple(d.strip() for d in devices.split(",") if d.strip()), engine=engine,
                store_path=store_path(store), max_queue=max_queue, served_model_name=served_model_name or None,
                local_prefill_tokens=local_prefill_tokens,
                supervision=Supervision(restart=restart, heartbeat_s=min(1.0, heartbeat_timeout / 4),
                                        heartbeat_timeout_s=heartbeat_timeout,
                                        step_timeout_s=step_timeout, checkpoint_timeout_s=checkpoint_timeout),
                autoplan=AutoplanSettings(autoplan_interval, min_gain, Slo.parse_pair(autoplan_slo)) if autoplan
                else None,
            )
            fleet = Fleet(config, launcher=ray_launcher(ray) if ray else None)
        except (FleetConfigError, DurationError) as exc:
            listener.close()
            raise fail(str(exc)) from None
    try:
        token = load_or_create_admin_token()
    except AdminTokenError as exc:
        raise fail(str(exc)) from None
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s", stream=sys.stderr)
    app = create_app(fleet, token, bound_host=host, api_key=api_key or None)
    server_config = uvicorn.Config(app, log_level="warning", access_log=access_log, log_config=None)
    logging.getLogger("uvicorn.access").setLevel(logging.INFO if access_log else logging.WARNING)
    logging.getLogger("uvicorn.error").setLevel(logging.CRITICAL)  # failures are reported below, in one line
    server = GracefulServer(server_config, fleet, grace)
    announce(server, fleet, host)
    try:
        server.run(sockets=[listener])
    except RuntimeError as exc:
        raise fail(str(exc)) from None
    except SystemExit:  # uvicorn exits 3 when the app's startup fails: say why instead
        if not app.state.startup_error:
            raise
    if app.state.startup_error:
        raise fail(app.state.startup_error)


def ray_launcher(address: str):
    """The Ray launcher for `--ray ADDRESS` (Ray is imported only here); one clear line if it cannot be had."""
    try:
        from fleetctl.engine.worker.ray_launcher import RayLauncher
    except ImportError as exc:
        raise fail(f"--ray needs Ray installed (pip install 'fleetctl[ray]'): {exc}") from None
    try:
        return RayLauncher(address)
    except (ConnectionError, RuntimeError, ValueError) as exc:
        raise fail(f"cannot join the Ray cluster at {address}: {exc}") from None


def bind(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    listener = socket.socket(family, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        listener.bind((host, port))
    except OSError as exc:
        listener.close()
        reason = "is in use (pick another with --port, or 0 for any)" if exc.errno == errno.EADDRINUSE else exc.strerror
        raise fail(f"cannot listen on {host}:{port}: {reason}") from None
    listener.listen(2048)
    return listener


def store_path(option: str) -> Path:
    from fleetctl.engine.paths import default_store_path

    return Path(option).expanduser() if option else default_store_path()


def announce(server, fleet, host: str) -> None:
    """Print the URL (with the real port) once uvicorn is listening."""
    startup = server.startup

    async def startup_and_announce(sockets=None) -> None:
        await startup(sockets)
        if server.started:
            bound = server.servers[0].sockets[0].getsockname()[1]
            fleet.url = f"http://{host}:{bound}"
            workers = ", ".join(f"{v.worker_id}@{v.device}" for v in fleet.views.values())
            print(f"fleetctl: serving {fleet.model_name} on {fleet.url} ({workers})", flush=True)

    server.startup = startup_and_announce


def _show(path: str, url: str | None, as_json: bool, render) -> None:
    try:
        data = FleetClient(url).get(path)
    except FleetClientError as exc:
        raise fail(str(exc)) from None
    if as_json:
        print(json.dumps(data))
    else:
        render(data)


def _worker_table(workers: list[dict]) -> None:
    on_nodes = any(w.get("node") for w in workers)  # a Ray fleet: which node each worker is on
    node_head = f"{'node':<13} " if on_nodes else ""
    print(f"{'worker':<12} {'role':<8} {'device':<8} {node_head}{'state':<9} {'pid':>7} {'sessions':>8} {'kv':>6} "
          f"{'busy':>6} {'mfu':>7} {'mbu':>7}")
    for w in workers:
        node = f"{(w.get('node') or '-') + (' (lost)' if w.get('node_lost') else ''):<13} " if on_nodes else ""
        print(f"{w['id']:<12} {w['role']:<8} {w['device']:<8} {node}{w['state']:<9} {w['pid'] or '-':>7} "
              f"{w['sessions']:>8} {w['kv_usage']:>6.1%} {w['busy']:>6.1%} {w['mfu']:>7.2%} {w['mbu']:>7.2%}")


def status(
    url: str = typer.Option(None, "--url", help="Fleet URL (default $FLEET_URL or http://127.0.0.1:8700)."),
    as_json: bool = typer.Option(False, "--json", help="One JSON object on stdout."),
) -> None:
    """Fleet summary: per-pool busy / MFU / MBU and the worker table."""

    def render(data: dict) -> None:
        print(f"model {data['model']}  url {data['url']}  (busy, MFU and MBU over the last {data['window_s']:g} s)")
        for name, pool in data["pools"].items():
            print(f"{name:<8} workers {pool['workers']}  busy {pool['busy']:.1%}  mfu {pool['mfu']:.2%}  "
                  f"mbu {pool['mbu']:.2%}  queue {pool['queue']}  prefix hits {pool['prefix_hit_ratio']:.1%}")
        print(f"local prefills (decode workers, no handoff): {data['local_prefills']}")
        _worker_table(data["workers"])

    _show("/fleet/status", url, as_json, render)


def workers(
    url: str = typer.Option(None, "--url", help="Fleet URL (default $FLEET_URL or http://127.0.0.1:8700)."),
    as_json: bool = typer.Option(False, "--json", help="One JSON object on stdout."),
) -> None:
    """The worker table."""
    _show("/fleet/workers", url, as_json, lambda data: _worker_table(data["workers"]))




def bench(
    url: str = typer.Option(None, "--url", help="Fleet URL (default $FLEET_URL or http://127.0.0.1:8700)."),
    trace: str = typer.Option(TraceKind.CHAT.value, "--trace", help="chat, rag, agent (multi-turn sessions), shift, "
                                                                    "or a trace file (JSONL: sessions or Mooncake, "
                                                                    "replayed whole)."),
    requests: int = typer.Option(32, "--requests", min=1, help="Requests to send."),
    rate: float = typer.Option(4.0, "--rate", min=0.0, help="Poisson arrivals per second (0: all at once)."),
    slo_ttft: float = typer.Option(2.0, "--slo-ttft", min=0.0, help="TTFT objective, seconds."),
    slo_tpot: float = typer.Option(0.2, "--slo-tpot", min=0.0, help="Time-per-output-token objective, seconds."),
    seed: int = typer.Option(0, "--seed"),
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
    as_json: bool = typer.Option(False, "--json", help="One JSON object on stdout."),
) -> None:
    """Load generator against a running fleet: requests/s, input and output tokens/s, TTFT/TPOT/E2E
    percentiles, goodput under the SLOs, KV handoff share."""
    import asyncio

    import httpx

    from fleetctl.console.bench import Outcome, fixed_lengths, run_bench
    from fleetctl.console.bench_report import print_results, save_results
    from fleetctl.console.client import FleetClient, FleetClientError, fleet_url
    from fleetctl.console.progress import stage_progress
    from fleetctl.console.traces import load_trace
    from fleetctl.engine.planner.trace_file import TraceFileError

    target = fleet_url(url)
    context = _context_of(target) if trace == TraceKind.AGENT and not compare_layouts else None
    try:
        name, requests_ = load_trace(trace, requests, rate, seed, context)
    except TraceFileError as exc:
        raise fail(str(exc)) from None
    if compare_layouts:
        from fleetctl.console.compare_layouts import compare_layouts_cmd

        compare_layouts_cmd(model, devices, name, requests_, slo_ttft, slo_tpot, store_dir, as_json)
        return
    try:
        FleetClient(target).get("/health")
    except FleetClientError as exc:
        if "no fleet answers" in str(exc):
            raise fail(str(exc)) from None

    async def run(progress: Callable[[str, int, int], None] | None) -> dict:
        async with httpx.AsyncClient(base_url=target, timeout=60.0) as http:
            trace_ = await fixed_lengths(http, requests_, input_len, output_len, seed)
        return await run_bench(target, trace_, name, slo_ttft, slo_tpot, max_concurrency=max_concurrency,
                               warmup=warmup, progress=progress, details=outcomes)

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


def _context_of(url: str) -> int | None:
    """The served model's context (`max_model_len` in /v1/models), which agent sessions are sized to; None
    when the fleet does not say (the sessions then assume an 8k context)."""
    from fleetctl.console.client import FleetClient, FleetClientError

    try:
        return FleetClient(url).get("/v1/models")["data"][0].get("max_model_len")
    except (FleetClientError, KeyError, IndexError):
        return None


def parse_window(text: str) -> float:
    """'90s', '10m', '2h', '1d' or plain seconds -> seconds."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([smhd]?)\s*", text)
    if not match:
        raise fail(f"bad --since {text!r}: use e.g. 90s, 10m, 2h, 1d")
    return float(match.group(1)) * {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}[match.group(2)]


def classify(
    since: str = typer.Option("10m", "--since", help="Window: 90s, 10m, 2h, 1d."),
    store: str = typer.Option("", "--store", help="SQLite metrics store (default $FLEET_HOME/fleet.db)."),
    as_json: bool = typer.Option(False, "--json", help="One JSON object on stdout."),
) -> None:
    """Traffic by phase: share of model time in prefill vs decode, by prompt/output length bucket."""
    from fleetctl.store.classify import classify as classify_window
    from fleetctl.store.db import open_db

    window_s = parse_window(since)
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
