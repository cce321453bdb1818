"""`fleetctl status` (the pools and the worker table) and `fleetctl workers` (the worker table alone), from the
fleet's typed answers (`FleetStatus`, `WorkerList`)."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

from fleetctl.console.cli.common import JSON_OPTION, URL_OPTION
from fleetctl.console.client import FleetClient

if TYPE_CHECKING:
    from fleetctl.engine.api.status import PoolInfo, WorkerInfo


def pool_line(name: str, pool: PoolInfo) -> str:
    """One pool's summary; a pool that verified drafts (`--speculative`) says how many stood and what a step gained."""
    line = (f"{name:<8} workers {pool.workers}  busy {pool.busy:.1%}  mfu {pool.mfu:.2%}  mbu {pool.mbu:.2%}  "
            f"queue {pool.queue}  prefix hits {pool.prefix_hit_ratio:.1%}")
    if pool.spec_acceptance is not None and pool.spec_tokens_per_step is not None:
        line += f"  drafts kept {pool.spec_acceptance:.0%} ({pool.spec_tokens_per_step:.2f} tokens a step)"
    if pool.outlier:
        line += f"  uneven: {pool.outlier}"
    return line


def _worker_table(workers: list[WorkerInfo]) -> None:
    on_nodes = any(w.node for w in workers)  # a Ray fleet: which node each worker is on
    node_head = f"{'node':<13} " if on_nodes else ""
    print(f"{'worker':<12} {'role':<8} {'device':<8} {node_head}{'state':<9} {'pid':>7} {'sessions':>8} {'kv':>6} "
          f"{'busy':>6} {'mfu':>7} {'mbu':>7} {'weights':<12} KV (format, tokens)")
    for w in workers:
        node = f"{(w.node or '-') + (' (lost)' if w.node_lost else ''):<13} " if on_nodes else ""
        print(f"{w.id:<12} {w.role:<8} {w.device:<8} {node}{w.shown_state:<9} {w.pid or '-':>7} "
              f"{w.sessions:>8} {w.kv_usage:>6.1%} {w.busy:>6.1%} {w.mfu:>7.2%} {w.mbu:>7.2%} {w.weights or '-':<12} "
              f"{w.kv_dtype or '-'} {w.kv_tokens:,}")


def status(url: str = URL_OPTION, as_json: bool = JSON_OPTION) -> None:
    """Fleet summary: per-pool busy / MFU / MBU and the worker table."""
    data = FleetClient(url).status()
    if as_json:
        print(json.dumps(data.model_dump(mode="json")))
        return
    print(f"model {data.model}  url {data.url}  (busy, MFU and MBU over the last {data.window_s:g} s)")
    for name, pool in data.pools.items():
        print(pool_line(name, pool))
    print(f"local prefills (decode workers, no handoff): {data.local_prefills}")
    if data.store and data.store.failing:
        print(f"metrics store FAILING: {data.store.error} ({data.store.kept_rows} rows kept; serving goes on)")
    _worker_table(data.workers)


def workers(url: str = URL_OPTION, as_json: bool = JSON_OPTION) -> None:
    """The worker table."""
    data = FleetClient(url).workers()
    if as_json:
        print(json.dumps(data.model_dump(mode="json")))
        return
    _worker_table(data.workers)
