"""What exporting every request's trace (`serve --otlp-endpoint`) costs the requests: the same chat trace through the
same fleet layout with tracing off and on, alternated over --rounds (this machine is noisy), to a collector on this
node (an OTLP/HTTP receiver in this process that decodes every export).

    python scripts/bench_tracing.py [--model smollm2-135m] [--requests 32] [--rate 2.0] [--rounds 2]
"""

import argparse
import asyncio
import statistics
import sys
from pathlib import Path

from fleetctl.console.cli.models import resolve_model
from fleetctl.console.loadgen.local_fleet import local_fleet
from fleetctl.console.loadgen.runner import run_bench
from fleetctl.console.loadgen.synthetic import TraceKind, make_trace

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from support.otlp_receiver import otlp_receiver  # the tests' collector


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--requests", type=int, default=32)
    parser.add_argument("--rate", type=float, default=2.0)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--devices", default="cpu:0,cpu:1")
    args = parser.parse_args()
    model = resolve_model(args.model)
    trace = make_trace(TraceKind.CHAT, args.requests, args.rate)
    layout = ("--prefill", "1", "--decode", "1", "--devices", args.devices)
    ttft: dict[str, list[dict]] = {"off": [], "on": []}
    exported = 0
    with otlp_receiver() as (endpoint, spans):
        for _ in range(args.rounds):
            for mode, extra in (("off", ()), ("on", ("--otlp-endpoint", endpoint))):
                with local_fleet(model, *layout, *extra) as url:
                    result = asyncio.run(run_bench(url, trace, "chat", slo_ttft=2.0, slo_tpot=0.2, warmup=2))
                ttft[mode].append(result["ttft_s"])
                print(mode, f"TTFT p50 {result['ttft_s']['p50']:.4f} s  p99 {result['ttft_s']['p99']:.4f} s",
                      flush=True)
        exported = sum(span.name == "request" for span in spans)
    for quantile in ("p50", "p99"):
        off = statistics.median(r[quantile] for r in ttft["off"])
        on = statistics.median(r[quantile] for r in ttft["on"])
        print(f"TTFT {quantile}: off {off:.4f} s, on {on:.4f} s ({on / off:.3f}x)")
    print(f"traces the collector received: {exported} (requests sent with tracing on: "
          f"{args.rounds * (args.requests + 2)})")


if __name__ == "__main__":
    main()
