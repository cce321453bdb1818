"""`fleetctl plan` (from a store fixture, tests/support/synthetic_fleet.py) and `fleetctl rebalance` (against a real
HTTP server in this process on a fleet of fake workers), through typer's CliRunner: what they print, `--json`, and
one error line with a non-zero exit for bad input."""

import json
import re
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from support.fake_fleet_server import fake_fleet_url
from support.synthetic_fleet import workload, write_store
from typer.testing import CliRunner, Result

from fleetctl.console.cli.app import app

EXAMPLE_TRACE = Path(__file__).parents[2] / "planner" / "data" / "mooncake_small.jsonl"


def fleetctl(*args: str) -> Result:
    return CliRunner().invoke(app, list(args))


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("plan-cli") / "fleet.db"
    write_store(path, workload("rag", 60, 1.5), t0=time.time() - 600)
    return path


def test_plan_prints_the_fit_the_candidates_and_the_reason(store: Path) -> None:
    result = fleetctl("plan", "--store", str(store), "--since", "1h", "--devices", "cpu:0,cpu:1,cpu:2")
    assert result.exit_code == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0] == ("plan for cpu:0, cpu:1, cpu:2: 60 requests from the store's last 1h; SLOs TTFT ≤ 2 s, "
                        "TPOT ≤ 200 ms")
    assert re.fullmatch(r"fit \(cpu\) prefill step = 60 steps, error 0\.0%: 0\.02 s \+ 0\.0004 s·tokens \+ 5e-08 "
                        r"s·tokens²", lines[1])
    assert re.fullmatch(r"fit \(cpu\) decode step = \d+ decodes, error \d+\.\d%: .*", lines[2])
    assert lines[3].startswith("fit (cpu) handoff = 60 handoffs")
    assert lines[4].split() == ["layout", "goodput/s", "band/s", "good", "TTFT", "p90", "TPOT", "p90"]
    assert {line.split()[0] for line in lines[5:-1]} == {"2:1", "1:2", "colocated"}
    assert lines[-1].startswith("recommended: ") and "req/s" in lines[-1]  # no advice: 1:1 was not replayed
    own = fleetctl("plan", "--store", str(store), "--since", "1h").stdout.splitlines()  # the store's 1:1 fleet
    assert re.fullmatch(r"advice: (keep 1:1|move to [^:]+): .* req/s\)", own[-1]), own[-1]


def test_plan_json_and_a_what_if_fleet(store: Path) -> None:
    result = fleetctl("plan", "--store", str(store), "--since", "1h", "--devices", "8xH200", "--json")
    assert result.exit_code == 0, result.stderr
    body = json.loads(result.stdout)
    assert body["what_if"] == {"gpu": "H200", "count": 8} and len(body["candidates"]) == 8
    assert "what-if 8x H200" in body["notes"][0]
    text = fleetctl("plan", "--store", str(store), "--since", "1h", "--devices", "8xH200")
    assert text.stdout.startswith("plan for 8x H200 (what-if): 60 requests")


def test_plan_replays_a_mooncake_trace(store: Path) -> None:
    result = fleetctl("plan", "--store", str(store), "--since", "1h", "--trace", str(EXAMPLE_TRACE), "--json")
    assert result.exit_code == 0, result.stderr
    body = json.loads(result.stdout)
    assert body["source"] == "trace" and body["requests"] == 12


@pytest.mark.parametrize(("args", "message"), [
    (("--since", "10 minutes"), "bad --since '10 minutes': use e.g. 90s, 10m, 2h, 1d"),
    (("--slo-tpot", "fast"), "bad --slo-tpot 'fast': use e.g. 2s, 200ms or 0.2 (seconds, > 0)"),
    (("--devices", "8xTPU"), "unknown GPU 'TPU' in --devices '8xTPU': the spec table knows H100 NVL,"),
    (("--since", "2s"), "no requests to replay: the last 2s of the store hold none"),
    (("--trace", "/nonexistent/trace.jsonl"), "cannot read trace /nonexistent/trace.jsonl"),
])
def test_plan_refuses_bad_input_with_one_line(store: Path, args: tuple[str, ...], message: str) -> None:
    result = fleetctl("plan", "--store", str(store), *args)
    assert result.exit_code == 1 and result.stdout == ""
    assert result.stderr.startswith(f"fleetctl: error: {message}") and result.stderr.count("\n") == 1


@pytest.mark.parametrize("since", ["0", "0s", "ten minutes"])
def test_classify_refuses_a_window_that_is_not_positive_with_one_line(store: Path, since: str) -> None:
    """`classify` reads --since as `plan` does (engine/planner/durations.py): a 0 window is refused too."""
    result = fleetctl("classify", "--store", str(store), "--since", since)
    assert result.exit_code == 1 and result.stdout == ""
    assert result.stderr == f"fleetctl: error: bad --since {since!r}: use e.g. 90s, 10m, 2h, 1d\n"


def test_plan_without_a_store_says_where_it_looked(tmp_path: Path) -> None:
    result = fleetctl("plan", "--store", str(tmp_path / "none.db"))
    assert result.exit_code == 1
    assert result.stderr == (f"fleetctl: error: no metrics store at {tmp_path / 'none.db'} (run a fleet with "
                             f"`fleetctl serve` first, or pass --store)\n")


@pytest.fixture
def url(tiny_model_dir: Path, tmp_path: Path) -> Iterator[str]:
    with fake_fleet_url(tiny_model_dir, tmp_path) as served:
        yield served


def test_rebalance_dry_run_apply_and_refusal(url: str) -> None:
    dry = fleetctl("rebalance", "--split", "2:1", "--url", url)
    assert dry.exit_code == 0, dry.stderr
    assert dry.stdout == ("1:2 -> 2:1: 1 worker(s) change role in place (the same process); their sessions move "
                          "live to peers that decode (a prefill worker's finish where they are)\n"
                          "  decode-0 on cpu:1: decode -> prefill (0 session(s))\n"
                          "dry run: add --apply to do it\n")
    applied = fleetctl("rebalance", "--split", "2:1", "--apply", "--url", url, "--json")
    assert applied.exit_code == 0, applied.stderr
    result = json.loads(applied.stdout)
    assert (result["split"], result["from"], result["evacuation"], result["via"]) == ("2:1", "1:2", "move", "switch")
    assert [(m["worker"], m["new_worker"]) for m in result["moves"]] == [("decode-0", "prefill-1")]
    back = fleetctl("rebalance", "--split", "1:2", "--apply", "--force", "--url", url)
    assert back.exit_code == 0, back.stderr
    assert re.fullmatch(r"fleet 2:1 → 1:2: 1 worker\(s\) changed role \(recompute, via restart\); "
                        r"0 session\(s\) moved, 0 finished, \d+\.\d s\n", back.stdout), back.stdout
    same = fleetctl("rebalance", "--split", "1:2", "--url", url)
    assert same.stdout == "the fleet is already at 1:2: nothing to move\n"
    refused = fleetctl("rebalance", "--split", "4:1", "--apply", "--url", url)
    assert refused.exit_code == 1 and refused.stdout == ""
    assert refused.stderr == ("fleetctl: error: POST /fleet/rebalance: HTTP 400: split 4:1 needs 5 devices and the "
                              "fleet runs 3 (cpu:0, cpu:1, cpu:2); it has no free one (list more with `serve "
                              "--devices`)\n")
