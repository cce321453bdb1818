"""`fleetctl bench`'s results for a person: one table (rates, latency percentiles, the SLOs and goodput; with
constrained turns, their schema-valid rate and TPOT beside the free turns'), and the file `--save` writes (the
summary and every request's numbers)."""

import json
from pathlib import Path

from rich.console import Console
from rich.table import Table

from fleetctl.console.loadgen.outcome import Outcome


def header(result: dict) -> str:
    lengths = f"{result.get('input_len') or 'trace'} in / {result.get('output_len') or 'trace'} out tokens"
    cap = result["max_concurrency"]
    api = result.get("agent_api", "completions")
    chat = f", turns sent as chat ({api.replace('_', ' ')})" if api != "completions" else ""
    return (f"bench {result['trace']} ({lengths}): {result['requests']} requests in {result['duration_s']:.1f} s, "
            f"max concurrency {cap or 'unlimited'}, warm-up {result['warmup']}{chat}")


def results_table(result: dict) -> Table:
    slo = result["slo"]
    table = Table()
    table.add_column("metric")
    for name in ("p50", "p90", "p99"):
        table.add_column(name, justify="right")
    rows = [("TTFT (ms)", "ttft_s"), ("TPOT (ms)", "tpot_s"), ("E2E (ms)", "e2e_s")]
    if result.get("constrained_requests"):
        rows += [("TPOT constrained turns (ms)", "tpot_constrained_s"),
                 ("TPOT free turns (ms)", "tpot_unconstrained_s")]
    for label, key in rows:
        table.add_row(label, *(f"{result[key][name] * 1000:.1f}" for name in ("p50", "p90", "p99")))
    if result.get("constrained_requests"):
        table.add_row("schema-valid rate", f"{result['schema_valid_rate']:.1%}",
                      f"{result['schema_valid_requests']}/{result['constrained_requests']} valid", "")
    table.add_section()
    table.add_row("requests/s", f"{result['request_throughput_rps']:.2f}", "", "")
    table.add_row("input tokens/s", f"{result['input_tokens_per_s']:.1f}", "", "")
    table.add_row("output tokens/s", f"{result['output_tokens_per_s']:.1f}", "", "")
    table.add_row("KV handoff share of E2E", f"{result['handoff_share_of_e2e']:.2%}", "", "")
    table.add_section()
    table.add_row(f"goodput (TTFT ≤ {slo['ttft_s']:g} s, TPOT ≤ {slo['tpot_s']:g} s)",
                  f"{result['goodput_rps']:.2f} req/s", f"{result['good_requests']}/{result['requests']} met", "")
    table.add_row("errors", str(result["errors"]), "", "")
    return table


def print_results(result: dict) -> None:
    console = Console(highlight=False)
    console.print(header(result), soft_wrap=True)
    console.print(results_table(result))


def save_results(path: Path, result: dict, outcomes: list[Outcome]) -> None:
    """The summary (as `--json` prints it) with every measured request's numbers under `per_request`."""
    path.write_text(json.dumps(result | {"per_request": [o.as_json() for o in outcomes]}, indent=2) + "\n")
