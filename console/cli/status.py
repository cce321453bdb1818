"""`fleetctl status` (the pools and the worker table) and `fleetctl workers` (the worker table alone)."""

import json
from collections.abc import Callable

from fleetctl.console.cli.common import JSON_OPTION, URL_OPTION, fleet_errors
from fleetctl.console.client import FleetClient


def _show(path: str, url: str | None, as_json: bool, render: Callable[[dict], None]) -> None:
    with fleet_errors():
        data = FleetClient(url).get(path)
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


def status(url: str = URL_OPTION, as_json: bool = JSON_OPTION) -> None:
    """Fleet summary: per-pool busy / MFU / MBU and the worker table."""

    def render(data: dict) -> None:
        print(f"model {data['model']}  url {data['url']}  (busy, MFU and MBU over the last {data['window_s']:g} s)")
        for name, pool in data["pools"].items():
            print(f"{name:<8} workers {pool['workers']}  busy {pool['busy']:.1%}  mfu {pool['mfu']:.2%}  "
                  f"mbu {pool['mbu']:.2%}  queue {pool['queue']}  prefix hits {pool['prefix_hit_ratio']:.1%}")
        print(f"local prefills (decode workers, no handoff): {data['local_prefills']}")
        _worker_table(data["workers"])

    _show("/fleet/status", url, as_json, render)


def workers(url: str = URL_OPTION, as_json: bool = JSON_OPTION) -> None:
    """The worker table."""
    _show("/fleet/workers", url, as_json, lambda data: _worker_table(data["workers"]))
