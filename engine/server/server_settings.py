"""What `fleetctl serve` sets for the HTTP server rather than for the fleet: where it listens, who may call it, how
much it takes at once, how it shuts down, and where its workers run (`--ray`)."""

from dataclasses import dataclass
from typing import Annotated

from fleetctl.engine.fleet.shutdown_budget import DEFAULT_GRACE_S, STOP_RESERVE_S, WORKER_EXIT_S
from fleetctl.options import EMPTY_IS_NONE, CliOption


@dataclass(frozen=True)
class ServerSettings:
    host: Annotated[str, CliOption(
        "--host", help="The address to listen on (anywhere but loopback, /fleet/* needs the admin token).")] = (
        "127.0.0.1")
    port: Annotated[int, CliOption("--port", help="0 picks a free port (printed).")] = 8700
    api_key: Annotated[str | None, CliOption(  # None: /v1/* is open
        "--api-key", convert=EMPTY_IS_NONE, envvar="FLEET_API_KEY",
        help="Require `Authorization: Bearer KEY` on /v1/* (also $FLEET_API_KEY).")] = None
    access_log: Annotated[bool, CliOption(
        "--access-log/--no-access-log", help="One line per HTTP request.")] = True
    limit_concurrency: Annotated[int, CliOption(  # 0: no limit
        "--limit-concurrency", min=0,
        help="Open connections (or requests in progress) beyond this get HTTP 503 with Retry-After, before any work "
             "(0: no limit). /health is always answered, and counts toward the limit.")] = 0
    grace_s: Annotated[float, CliOption(
        "--grace", min=0.0,
        help=f"On SIGTERM/SIGINT: seconds the whole shutdown takes at most. Requests in flight get all but "
             f"{STOP_RESERVE_S:g} s of it (at least half) to finish (new ones get 503), the rest end with an error, "
             f"then workers get up to {WORKER_EXIT_S:g} s to exit before they are killed.")] = DEFAULT_GRACE_S
    response_ttl_s: Annotated[float, CliOption(
        "--response-ttl", min=0.0,
        help="Seconds a /v1/responses answer stays continuable by `previous_response_id` (its conversation, in the "
             "server's memory; the turns' KV stays in the pools for --session-ttl).")] = 3600.0
    store_reset: Annotated[bool, CliOption(
        "--store-reset", help="If the store is not a database (corrupt, or another file), move it aside and start a "
                              "fresh one (the new name is printed).")] = False
    ray: Annotated[str | None, CliOption(  # None: workers are this machine's processes
        "--ray", convert=EMPTY_IS_NONE, metavar="[ADDRESS]",
        help="Workers as Ray actors: no value or `auto` (this machine's Ray, started if none runs), or a cluster's "
             "address. Devices may name a node: node2/cpu:0, node2/cuda:0.")] = None
