"""`fleetctl serve`, `status`, `workers`."""

import json

import typer
from fleetctl.console.client import FleetClient, FleetClientError
from fleetctl.console.errors import fail, user_errors
from fleetctl.console.models_cmd import resolve_model
from fleetctl.engine.model.registry import DEFAULT_MODEL


def serve(
    model: str = typer.Option(DEFAULT_MODEL, "--model", "-m", help="Store name or Hugging Face directory."),
    prefill: int = typer.Option(1, "--prefill", help="Prefill workers."),
    decode: int = typer.Option(1, "--decode", help="Decode workers."),
    colocated: int = typer.Option(0, "--colocated", help="Baseline: N mixed workers, no handoff."),
    devices: str = typer.Option("", "--devices", help="cuda:0,cuda:1,… or cpu:0,cpu:1,… one per worker."),
    host: str = typer.Option("127.0.0.1", "--host"),
    port: int = typer.Option(8700, "--port", help="0 picks a free port (printed)."),
    dtype: str = typer.Option("auto", "--dtype", help="auto|float32|bfloat16|float16."),
    deterministic: bool = typer.Option(False, "--deterministic", help="Batch-invariant numerics in every worker."),
    kv_memory: int = typer.Option(0, "--kv-memory", help="Cap each worker's KV pool (MiB); 0 sizes it from memory."),
    kv_blocks: int = typer.Option(0, "--kv-blocks", help="Exact KV blocks per worker (overrides --kv-memory)."),
) -> None:
    """Run a fleet and its HTTP server in the foreground."""
    import uvicorn
    from fleetctl.engine.admin_auth import is_loopback, load_or_create_admin_token
    from fleetctl.engine.fleet import Fleet
    from fleetctl.engine.fleet_config import FleetConfig, FleetConfigError
    from fleetctl.engine.server import create_app

    with user_errors():
        try:
            config = FleetConfig(
                model_dir=resolve_model(model), prefill=prefill, decode=decode, colocated=colocated,
                devices=tuple(d.strip() for d in devices.split(",") if d.strip()), dtype=dtype,
                deterministic=deterministic, kv_memory_bytes=kv_memory * 2**20 or None,
                num_kv_blocks=kv_blocks or None,
            )
            fleet = Fleet(config)
        except FleetConfigError as exc:
            raise fail(str(exc)) from None
    token = None if is_loopback(host) else load_or_create_admin_token()
    server_config = uvicorn.Config(create_app(fleet, admin_token=token), host=host, port=port, log_level="warning")
    server = uvicorn.Server(server_config)
    announce(server, fleet, host)
    try:
        server.run()
    except RuntimeError as exc:
        raise fail(str(exc)) from None


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
    print(f"{'worker':<12} {'role':<8} {'device':<8} {'state':<9} {'pid':>7} {'sessions':>8} {'kv':>6} "
          f"{'busy':>6} {'mfu':>7} {'mbu':>7}")
    for w in workers:
        print(f"{w['id']:<12} {w['role']:<8} {w['device']:<8} {w['state']:<9} {w['pid'] or '-':>7} "
              f"{w['sessions']:>8} {w['kv_usage']:>6.1%} {w['busy']:>6.1%} {w['mfu']:>7.2%} {w['mbu']:>7.2%}")


def status(
    url: str = typer.Option(None, "--url", help="Fleet URL (default $FLEET_URL or http://127.0.0.1:8700)."),
    as_json: bool = typer.Option(False, "--json", help="One JSON object on stdout."),
) -> None:
    """Fleet summary: per-pool busy / MFU / MBU and the worker table."""

    def render(data: dict) -> None:
        print(f"model {data['model']}  url {data['url']}")
        for name, pool in data["pools"].items():
            print(f"{name:<8} workers {pool['workers']}  busy {pool['busy']:.1%}  mfu {pool['mfu']:.2%}  "
                  f"mbu {pool['mbu']:.2%}  queue {pool['queue']}")
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
    trace: str = typer.Option("chat", "--trace", help="chat | rag | agent."),
    requests: int = typer.Option(32, "--requests", help="Requests to send."),
    rate: float = typer.Option(4.0, "--rate", help="Poisson arrivals per second (0: all at once)."),
    slo_ttft: float = typer.Option(2.0, "--slo-ttft", help="TTFT objective, seconds."),
    slo_tpot: float = typer.Option(0.2, "--slo-tpot", help="Time-per-output-token objective, seconds."),
    seed: int = typer.Option(0, "--seed"),
    as_json: bool = typer.Option(False, "--json", help="One JSON object on stdout."),
) -> None:
    """Load generator against a running fleet: throughput, goodput, TTFT/TPOT/E2E, handoff share."""
    import asyncio

    from fleetctl.console.bench import run_bench
    from fleetctl.console.client import fleet_url
    from fleetctl.console.traces import TraceKind, make_trace

    try:
        kind = TraceKind(trace)
    except ValueError:
        raise fail(f"unknown trace {trace!r}: choose chat, rag or agent") from None
    if requests < 1:
        raise fail("--requests must be at least 1")
    try:
        result = asyncio.run(run_bench(fleet_url(url), make_trace(kind, requests, rate, seed), kind.value,
                                       slo_ttft, slo_tpot))
    except (OSError, ValueError, KeyError) as exc:
        raise fail(f"bench failed against {fleet_url(url)}: {exc}") from None
    if as_json:
        print(json.dumps(result))
        return
    for key, value in result.items():
        print(f"{key:<24} {value}")
