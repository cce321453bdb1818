"""`fleetctl bench` against a real fleet (tiny model): fixed input/output lengths hit exactly, the cap on
requests in flight holds, warm-up requests are not measured, `--save` keeps every request, `--json` is one
object, and the table a person reads shows the rates, the percentiles, the SLOs and goodput."""

import asyncio
import json
from pathlib import Path

import pytest
from rich.console import Console
from support.fleet_harness import fleetctl, serve

from fleetctl.console.loadgen.outcome import Outcome, constrained_summary
from fleetctl.console.loadgen.report import header, results_table, save_results
from fleetctl.console.loadgen.runner import run_bench
from fleetctl.console.loadgen.synthetic import TraceKind, make_trace

FLEET = ("--prefill", "1", "--decode", "1", "--devices", "cpu:0,cpu:1", "--dtype", "float32", "--kv-blocks", "128")


@pytest.fixture(scope="module")
def url(tiny_model_dir: Path):
    with serve(tiny_model_dir, *FLEET) as fleet_url:
        yield fleet_url


@pytest.mark.fleet
def test_fixed_lengths_concurrency_cap_warmup_and_saved_requests(url: str, tmp_path: Path) -> None:
    saved = tmp_path / "results.json"
    result = fleetctl("bench", "--url", url.removeprefix("http://"), "--requests", "6", "--rate", "0",
                      "--input-len", "40", "--output-len", "6", "--max-concurrency", "2", "--warmup", "2",
                      "--save", str(saved), "--json")
    assert result.returncode == 0, result.stderr
    (line,) = result.stdout.splitlines()  # one JSON object, nothing else
    summary = json.loads(line)
    assert (summary["input_tokens"], summary["output_tokens"]) == (6 * 40, 6 * 6)  # warm-up not counted
    assert summary["requests"] == 6 and summary["errors"] == 0 and summary["warmup"] == 2
    assert summary["max_concurrency"] == 2 and summary["slo"] == {"ttft_s": 2.0, "tpot_s": 0.2}
    assert summary["request_throughput_rps"] > 0 and summary["input_tokens_per_s"] > summary["output_tokens_per_s"]
    per_request = json.loads(saved.read_text())["per_request"]
    assert len(per_request) == 6 and all(r["prompt_tokens"] == 40 for r in per_request)
    spans = [(r["start_s"], r["start_s"] + r["e2e_s"]) for r in per_request]
    most_in_flight = max(sum(1 for s, e in spans if s <= start < e) for start, _ in spans)
    assert most_in_flight <= 2


@pytest.mark.fleet
def test_the_table_and_progress(url: str) -> None:
    result = fleetctl("bench", "--url", url, "--requests", "3", "--rate", "0", "--output-len", "4",
                      "--slo-ttft", "1.5", "--slo-tpot", "0.1")
    assert result.returncode == 0, result.stderr
    for text in ("TTFT (ms)", "TPOT (ms)", "E2E (ms)", "p90", "p99", "requests/s", "input tokens/s",
                 "output tokens/s", "goodput (TTFT ≤ 1.5 s, TPOT ≤ 0.1 s)"):
        assert text in result.stdout, text
    assert "{" not in result.stdout  # no Python dict
    calls: list[tuple[str, int, int]] = []
    trace = make_trace(TraceKind.AGENT, 3, 0.0)[:3]
    asyncio.run(run_bench(url, trace, "agent", 2.0, 0.2, warmup=1, progress=lambda *c: calls.append(c)))
    assert calls[0] == ("warm-up", 0, 1) and ("requests", 3, 3) in calls
    assert [done for stage, done, _ in calls if stage == "requests"] == [0, 1, 2, 3]


def test_results_table_lists_every_number_without_a_fleet() -> None:
    cuts = {"p50": 0.1, "p90": 0.2, "p99": 0.3}
    result = {"trace": "chat", "requests": 10, "duration_s": 5.0, "goodput_rps": 1.5, "ttft_s": cuts, "tpot_s": cuts,
              "e2e_s": cuts, "handoff_share_of_e2e": 0.01, "errors": 1, "request_throughput_rps": 1.8,
              "input_tokens_per_s": 900.0, "output_tokens_per_s": 120.0, "good_requests": 7,
              "slo": {"ttft_s": 2.0, "tpot_s": 0.2}, "max_concurrency": 4, "warmup": 2, "input_len": 512,
              "output_len": None}
    console = Console(record=True, width=160)
    console.print(results_table(result))
    text = header(result) + console.export_text()
    for expected in ("512 in / trace out tokens", "max concurrency 4", "warm-up 2", "100.0", "200.0", "300.0",
                     "1.80", "900.0", "120.0", "1.50 req/s", "7/10 met", "TTFT ≤ 2 s, TPOT ≤ 0.2 s"):
        assert expected in text, expected


def test_constrained_turns_add_the_schema_valid_rate_and_their_tpot_beside_the_free_turns(tmp_path: Path) -> None:
    outcomes = [Outcome(ttft_s=0.1, e2e_s=1.1, completion_tokens=11, constrained=True),  # TPOT 100 ms
                Outcome(ttft_s=0.1, e2e_s=2.1, completion_tokens=11, constrained=True, schema_problem="no tool call"),
                Outcome(ttft_s=0.1, e2e_s=0.6, completion_tokens=11),  # free: TPOT 50 ms
                Outcome(constrained=True, error="HTTP 400: no")]  # a failed request stays an error, not invalid
    summary = constrained_summary(outcomes)
    assert (summary["constrained_requests"], summary["schema_valid_requests"], summary["schema_valid_rate"]) == (
        2, 1, 0.5)
    assert summary["tpot_constrained_s"]["p50"] == pytest.approx(0.15) and summary["tpot_constrained_s"]["p90"] > 0.15
    assert summary["tpot_unconstrained_s"]["p50"] == pytest.approx(0.05)
    assert constrained_summary(outcomes[2:3])["schema_valid_rate"] is None
    cuts = {"p50": 0.1, "p90": 0.2, "p99": 0.3}
    result = {"trace": "agent", "requests": 4, "duration_s": 5.0, "goodput_rps": 0.2, "ttft_s": cuts, "tpot_s": cuts,
              "e2e_s": cuts, "handoff_share_of_e2e": 0.0, "errors": 1, "request_throughput_rps": 0.6,
              "input_tokens_per_s": 9.0, "output_tokens_per_s": 6.0, "good_requests": 1,
              "slo": {"ttft_s": 2.0, "tpot_s": 0.2}, "max_concurrency": None, "warmup": 0, "input_len": None,
              "output_len": None, "agent_api": "tools", **summary}
    console = Console(record=True, width=160)
    console.print(results_table(result))
    text = header(result) + console.export_text()
    for expected in ("turns sent as chat (tools)", "TPOT constrained turns (ms)", "150.0", "TPOT free turns (ms)",
                     "50.0", "schema-valid rate", "50.0%", "1/2 valid"):
        assert expected in text, expected
    saved = tmp_path / "saved.json"
    save_results(saved, result, outcomes)
    rows = json.loads(saved.read_text())["per_request"]
    assert [(r["constrained"], r["schema_valid"]) for r in rows] == [(True, True), (True, False), (False, None),
                                                                      (True, None)]
    assert rows[1]["schema_problem"] == "no tool call"
