"""`fleetctl bench --compare-layouts`: the same trace against a colocated fleet and against the
prefill:decode split `plan` picks from that run, on the same devices, each fleet started fresh (with a
store of its own) and stopped after; the answer is the ratio of their measured goodputs."""

import asyncio
import tempfile
from pathlib import Path

from fleetctl.console.loadgen.local_fleet import CPU_DECODE_WORKERS, local_fleet
from fleetctl.console.loadgen.requests import TraceRequest
from fleetctl.console.loadgen.runner import run_bench
from fleetctl.engine.planner.plan import PlanRequest, plan_from_store
from fleetctl.engine.planner.slo import Slo
from fleetctl.errors import UserError

WHOLE_STORE_S = 7 * 86400.0  # each store holds one run: plan over all of it


def default_devices() -> list[str]:
    """Every GPU, or without GPUs the embedded fleet's CPU slots."""
    from fleetctl.engine.core.local_devices import gpu_count

    gpus = gpu_count()
    return [f"cuda:{i}" for i in range(gpus)] if gpus else [f"cpu:{i}" for i in range(1 + CPU_DECODE_WORKERS)]


def _bench(model: str, layout: list[str], store: Path, trace: list[TraceRequest], name: str, slo: Slo) -> dict:
    with local_fleet(model, *layout, "--store", str(store)) as url:
        return asyncio.run(run_bench(url, trace, name, slo.ttft_s, slo.tpot_s))


def compare_layouts(model: str, devices: list[str], trace: list[TraceRequest], name: str, slo: Slo,
                    store_dir: Path | None = None) -> dict:
    """Raises FleetStartError (a fleet did not start) or a UserError (the plan between the runs refused).
    `store_dir` keeps the runs' stores (colocated.db, split.db) for `plan --store` later."""
    joined = ",".join(devices)
    with tempfile.TemporaryDirectory(prefix="fleetctl-compare-") as tmp:
        stores = store_dir or Path(tmp)
        stores.mkdir(parents=True, exist_ok=True)
        for store_name in ("colocated.db", "split.db"):
            for suffix in ("", "-wal", "-shm"):
                (stores / f"{store_name}{suffix}").unlink(missing_ok=True)  # each store holds one run
        colocated = _bench(model, ["--colocated", str(len(devices)), "--devices", joined], stores / "colocated.db",
                           trace, name, slo)
        plan = plan_from_store(stores / "colocated.db", WHOLE_STORE_S, PlanRequest(slo, joined))
        best = plan.best_split
        if best is None:
            raise UserError(f"{len(devices)} device(s) have no prefill:decode split: compare on two or more")
        # every prompt through the prefill pool, as the replay that chose this split assumed (no local prefills)
        layout = ["--prefill", str(best.split.prefill), "--decode", str(best.split.decode), "--devices", joined,
                  "--local-prefill-tokens", "0"]
        split = _bench(model, layout, stores / "split.db", trace, name, slo)
    predicted = plan.candidate(plan.current)
    return {
        "trace": name, "devices": devices, "slo": {"ttft_s": slo.ttft_s, "tpot_s": slo.tpot_s},
        "colocated": colocated,
        "split": best.split.as_json(),
        "disaggregated": split,
        "goodput_ratio": round(split["goodput_rps"] / colocated["goodput_rps"], 3) if colocated["goodput_rps"]
        else None,
        "predicted": {"colocated_goodput": predicted.goodput if predicted else None, "split_goodput": best.goodput},
        "plan": plan.as_json(),
    }


def render_comparison(result: dict) -> str:
    split = f"{result['split']['prefill']}:{result['split']['decode']}"
    rows = [("colocated", result["colocated"], result["predicted"]["colocated_goodput"]),
            (split, result["disaggregated"], result["predicted"]["split_goodput"])]
    lines = [f"trace {result['trace']} on {', '.join(result['devices'])} (SLOs TTFT ≤ {result['slo']['ttft_s']:g} s, "
             f"TPOT ≤ {result['slo']['tpot_s']:g} s); the split is the one `plan` picked from the colocated run",
             f"{'layout':<10} {'goodput/s':>9} {'predicted':>9} {'TTFT p90':>9} {'TPOT p90':>9} {'errors':>6}"]
    for label, bench, predicted in rows:
        guess = "-" if predicted is None else f"{predicted:.3f}"
        lines.append(f"{label:<10} {bench['goodput_rps']:>9.3f} {guess:>9} {bench['ttft_s']['p90']:>8.3f}s "
                     f"{bench['tpot_s']['p90']:>8.3f}s {bench['errors']:>6}")
    ratio = result["goodput_ratio"]
    lines.append(f"goodput ratio {split} / colocated: {'-' if ratio is None else f'{ratio:.2f}x'}")
    return "\n".join(lines)
