"""`fleetctl serve`: a fleet and its HTTP server in the foreground. The options' defaults are the fleet's own
(FleetConfig, Supervision, EngineSettings, AutoplanSettings), read from where they are declared."""

import errno
import os
import socket
import sys
from pathlib import Path

import typer

from fleetctl.console.cli.common import (
    EXIT_INTERRUPTED,
    QUANT_GROUP_OPTION,
    QUANTIZATION_OPTION,
    STORE_OPTION,
    fail,
    store_path,
)
from fleetctl.console.cli.models import resolve_model
from fleetctl.domain import Quantization, WorkerRole
from fleetctl.engine.core.engine_settings import CompileMode, DType, EngineSettings, OffloadPolicy
from fleetctl.engine.fleet.fleet_config import DEFAULT_LOCAL_PREFILL_TOKENS, FleetConfig, Supervision
from fleetctl.engine.fleet.shutdown_budget import DEFAULT_GRACE_S, SERVER_CLOSE_S, STOP_RESERVE_S, WORKER_EXIT_S
from fleetctl.engine.model.registry import DEFAULT_MODEL
from fleetctl.engine.planner.autoplan_settings import AutoplanSettings


def serve(
    model: str = typer.Option(DEFAULT_MODEL, "--model", "-m", help="Store name or Hugging Face directory."),
    prefill: int = typer.Option(1, "--prefill", help="Prefill workers."),
    decode: int = typer.Option(1, "--decode", help="Decode workers."),
    colocated: int = typer.Option(0, "--colocated", help="Baseline: N mixed workers, no handoff."),
    devices: str = typer.Option("", "--devices", help="cuda:0,cuda:1,… or cpu:0,cpu:1,… one per worker, and any "
                                                      "beyond them free for start, rebalance and --max-workers; a "
                                                      "GPU named twice (cuda:0,cuda:0) is split into slots "
                                                      "cuda:0#0, cuda:0#1, each with an even share of its memory "
                                                      "(or --kv-memory)."),
    host: str = typer.Option("127.0.0.1", "--host"),
    port: int = typer.Option(8700, "--port", help="0 picks a free port (printed)."),
    dtype: DType = typer.Option(DType.AUTO, "--dtype", help="auto: bf16 if all devices have it natively, else fp32."),
    deterministic: bool = typer.Option(False, "--deterministic", help="Batch-invariant numerics in every worker."),
    quantization: Quantization = QUANTIZATION_OPTION,
    prefill_quantization: Quantization | None = typer.Option(
        None, "--prefill-quantization", help="The prefill workers' linear weights (default --quantization): "
                                             "prefill is arithmetic-bound, so 16-bit weights beside 4-bit decode."),
    decode_quantization: Quantization | None = typer.Option(
        None, "--decode-quantization", help="The decode workers' linear weights (default --quantization)."),
    quant_group_size: int = QUANT_GROUP_OPTION,
    prefix_cache: bool = typer.Option(True, "--prefix-cache/--no-prefix-cache",
                                      help="Reuse the KV of prompts' shared leading blocks (on by default)."),
    local_prefill_tokens: int = typer.Option(
        DEFAULT_LOCAL_PREFILL_TOKENS, "--local-prefill-tokens", min=0,
        help="A decode worker caching part of a prompt prefills it itself (no handoff) when at most this many of "
             "its tokens are uncached there; 0: always the prefill pool."),
    kv_memory: int = typer.Option(0, "--kv-memory", min=0, help="Cap each worker's KV pool, MiB (0: from memory)."),
    kv_blocks: int = typer.Option(0, "--kv-blocks", min=0, help="Exact KV blocks per worker (overrides --kv-memory)."),
    kv_offload_memory: int = typer.Option(
        0, "--kv-offload-memory", min=0,
        help="MiB of host memory (/dev/shm, shared by the node's workers) keeping the KV blocks the pools evict, "
             "read back instead of recomputed (0: none; needs the prefix cache)."),
    kv_offload_dir: Path | None = typer.Option(None, "--kv-offload-dir", help="A folder for a disk tier below the "
                                                                              "host one (with --kv-offload-gb)."),
    kv_offload_gb: float = typer.Option(0.0, "--kv-offload-gb", min=0.0, help="The disk tier's bound, GB."),
    kv_offload_policy: OffloadPolicy = typer.Option(
        OffloadPolicy.EVICT, "--kv-offload-policy",
        help="evict: a block goes to the tiers as its pool reclaims it; write-through: as soon as it is full (a "
             "stopped or restarted worker leaves its whole cache there)."),
    session_ttl: float = typer.Option(
        0.0, "--session-ttl", min=0.0,
        help="Seconds a named session's KV (X-Session-Id, or the request's `user`) stays in the pools after its "
             "turn, reclaimed only when nothing else can be (then to the tiers, if any; 0: not kept)."),
    kv_offload_host_dir: Path | None = typer.Option(None, "--kv-offload-host-dir",
                                                    help="The host tier's folder (default /dev/shm/fleetctl-host-tier: "
                                                         "every fleet of the node shares it)."),
    otlp_endpoint: str = typer.Option(
        "", "--otlp-endpoint", help="An OTLP/HTTP traces URL (a collector's http://host:4318/v1/traces): each "
                                    "request's trace — admission, queue, prefill, KV handoff, decode, live moves."),
    store: str = STORE_OPTION,
    store_reset: bool = typer.Option(False, "--store-reset", help="If the store is not a database (corrupt, or "
                                                                  "another file), move it aside and start a fresh "
                                                                  "one (the new name is printed)."),
    max_queue: int = typer.Option(FleetConfig.max_queue, "--max-queue", min=0,
                                  help="Requests waiting to generate (queued, prefilling, KV awaiting a decode "
                                       "worker) beyond this get HTTP 429 with Retry-After."),
    limit_concurrency: int = typer.Option(0, "--limit-concurrency", min=0,
                                          help="Open connections (or requests in progress) beyond this get HTTP "
                                               "503 with Retry-After, before any work (0: no limit). /health is "
                                               "always answered, and counts toward the limit."),
    max_num_seqs: int = typer.Option(EngineSettings.max_num_seqs, "--max-num-seqs", min=1,
                                     help="Sequences per worker batch."),
    max_num_batched_tokens: int = typer.Option(EngineSettings.max_num_batched_tokens, "--max-num-batched-tokens",
                                               min=16, help="Prompt tokens one step computes: a longer prompt is "
                                                            "prefilled in chunks (between them a mixed worker "
                                                            "decodes)."),
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
    grace: float = typer.Option(DEFAULT_GRACE_S, "--grace", min=0.0,
                                help=f"On SIGTERM/SIGINT: seconds the whole shutdown takes at most. Requests in "
                                     f"flight get all but {STOP_RESERVE_S:g} s of it (at least half) to finish "
                                     f"(new ones get 503), the rest end with an error, then workers get up to "
                                     f"{WORKER_EXIT_S:g} s to exit before they are killed."),
    restart: bool = typer.Option(True, "--restart/--no-restart", help="Restart workers that die (with backoff)."),
    heartbeat_timeout: float = typer.Option(Supervision.heartbeat_timeout_s, "--heartbeat-timeout", min=0.1,
                                            help="Seconds of silence after which a worker counts as hung and is "
                                                 "killed (its sessions recomputed, the worker restarted)."),
    step_timeout: float = typer.Option(Supervision.step_timeout_s, "--step-timeout", min=0.1,
                                       help="Seconds: one model step running longer counts as hung."),
    checkpoint_timeout: float = typer.Option(Supervision.checkpoint_timeout_s, "--checkpoint-timeout", min=0.1,
                                             help="Seconds: a checkpoint not written by then is called off; "
                                                  "the worker serves on."),
    autoplan: bool = typer.Option(False, "--autoplan", help="Plan every interval and rebalance when the gain holds."),
    autoplan_interval: float = typer.Option(AutoplanSettings.interval_s, "--autoplan-interval", min=1.0,
                                            help="Seconds per autoplan window."),
    min_gain: float = typer.Option(AutoplanSettings.min_gain_pct, "--min-gain", min=0.0,
                                   help="Predicted goodput gain (%) autoplan needs, two windows in a row."),
    autoplan_slo: str = typer.Option("2s,200ms", "--autoplan-slo", help="TTFT,TPOT objectives autoplan's goodput "
                                                                        "counts against."),
    max_workers: int = typer.Option(0, "--max-workers", min=0,
                                    help="Autoplan may grow the fleet to N workers on the free devices of --devices "
                                         "and shrink it (stopping idle workers); 0 keeps the worker count."),
    hysteresis: float = typer.Option(AutoplanSettings.hysteresis_s, "--autoplan-hysteresis", min=0.0,
                                     help="Seconds autoplan waits after a change before the next."),
    ray: str = typer.Option("", "--ray", metavar="[ADDRESS]",
                            help="Workers as Ray actors: no value or `auto` (this machine's Ray, started if none "
                                 "runs), or a cluster's address. Devices may name a node: node2/cpu:0, node2/cuda:0."),
) -> None:
    """Run a fleet and its HTTP server in the foreground (a stats line every 10 s on stderr)."""
    import logging

    import uvicorn

    os.umask(0o077)  # everything the fleet writes (store, checkpoints, handoff buffers, token) is the user's alone

    from fleetctl.engine.api.admin_token import load_or_create_admin_token
    from fleetctl.engine.fleet.controller import Fleet
    from fleetctl.engine.planner.slo import Slo
    from fleetctl.engine.server.app import create_app
    from fleetctl.engine.server.graceful import GracefulServer
    from fleetctl.engine.server.overload import ConnectionLimit

    if max_workers and not autoplan:
        raise fail("--max-workers sets how far --autoplan may grow the fleet: give --autoplan with it")
    listener = bind(host, port)  # first: a taken port fails in milliseconds, before a model is even looked at
    if store_reset:
        reset_if_corrupt(store_path(store))
    try:
        engine = EngineSettings(dtype=dtype, deterministic=deterministic, max_num_seqs=max_num_seqs,
                                max_num_batched_tokens=max_num_batched_tokens,
                                kv_memory_bytes=kv_memory * 2**20 or None, num_kv_blocks=kv_blocks or None,
                                max_model_len=max_model_len or None, prefix_cache=prefix_cache,
                                compile=compile_mode, quantization=quantization,
                                quant_group_size=quant_group_size,
                                kv_offload_memory_bytes=kv_offload_memory * 2**20,
                                kv_offload_host_dir=kv_offload_host_dir, kv_offload_dir=kv_offload_dir,
                                kv_offload_disk_bytes=int(kv_offload_gb * 1e9),
                                kv_offload_policy=kv_offload_policy, session_ttl_s=session_ttl)
        config = FleetConfig(
            model_dir=resolve_model(model), prefill=prefill, decode=decode, colocated=colocated,
            devices=tuple(d.strip() for d in devices.split(",") if d.strip()), engine=engine,
            store_path=store_path(store), max_queue=max_queue, served_model_name=served_model_name or None,
            otlp_endpoint=otlp_endpoint or None,
            local_prefill_tokens=local_prefill_tokens,
            role_quantization=tuple(
                (role, value) for role, value in ((WorkerRole.PREFILL, prefill_quantization),
                                                  (WorkerRole.DECODE, decode_quantization)) if value is not None),
            supervision=Supervision(restart=restart, heartbeat_s=min(1.0, heartbeat_timeout / 4),
                                    heartbeat_timeout_s=heartbeat_timeout,
                                    step_timeout_s=step_timeout, checkpoint_timeout_s=checkpoint_timeout),
            autoplan=AutoplanSettings(autoplan_interval, min_gain, Slo.parse_pair(autoplan_slo),
                                      max_workers or None, hysteresis) if autoplan else None,
        )
        fleet = Fleet(config, launcher=ray_launcher(ray) if ray else None)
    except BaseException:  # a bad option, a model that cannot be had, Ctrl-C: the port is free at once
        listener.close()
        raise
    token = load_or_create_admin_token()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s", stream=sys.stderr)
    app = create_app(fleet, token, bound_host=host, api_key=api_key or None)
    server_config = uvicorn.Config(app, log_level="warning", access_log=access_log, log_config=None,
                                   timeout_graceful_shutdown=SERVER_CLOSE_S)
    logging.getLogger("uvicorn.access").setLevel(logging.INFO if access_log else logging.WARNING)
    logging.getLogger("uvicorn.error").setLevel(logging.CRITICAL)  # failures are reported below, in one line
    server = GracefulServer(server_config, fleet, grace)
    if limit_concurrency:  # counted from uvicorn's own tally of the server's connections and requests
        server_config.app = ConnectionLimit(app, limit_concurrency, server.server_state)
    announce(server, fleet, host)
    try:
        server.run(sockets=[listener])
    except KeyboardInterrupt:  # the SIGINT uvicorn re-raises once the fleet has shut down: nothing went wrong
        raise typer.Exit(EXIT_INTERRUPTED) from None
    except SystemExit:  # uvicorn exits 3 when the app's startup fails: say why instead
        if not app.state.startup_error:
            raise
    if app.state.startup_error:
        raise fail(app.state.startup_error)


def reset_if_corrupt(path: Path) -> None:
    """--store-reset: a store that is not a database is moved aside (a sound one, or one with another problem, is
    left for the fleet to open or to refuse)."""
    from fleetctl.store.db import move_aside, open_db
    from fleetctl.store.errors import StoreFileError, StoreProblem

    try:
        open_db(path).close()
    except StoreFileError as exc:
        if exc.problem is not StoreProblem.NOT_A_DATABASE:
            raise
        print(f"fleetctl: the store {exc.path} was not a database: moved it aside to {move_aside(exc.path)}; "
              f"starting a fresh one", file=sys.stderr)


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
