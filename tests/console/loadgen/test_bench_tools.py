"""`fleetctl bench --trace agent --tools` and `--response-format` against a real smollm2-135m fleet (its template
has no tool support: the generic JSON format), both runs at once: every constrained answer is valid under the
schema asked, and the report has the constrained turns' TPOT beside the free turns'."""

import json
import subprocess
from pathlib import Path

import pytest
from support.fleet_harness import serve

from fleetctl.console.loadgen.local_fleet import FLEETCTL

pytestmark = pytest.mark.fleet


@pytest.fixture(scope="module")
def url(smollm2_dir: Path):
    # a 2k context scales the agent sessions down (agent_sessions.py), so that their prompts prefill fast
    with serve(smollm2_dir, "--prefill", "1", "--decode", "1", "--devices", "cpu:0,cpu:1", "--max-model-len", "2048",
               "--session-ttl", "300") as fleet_url:
        yield fleet_url


def test_tools_and_response_format_runs_are_schema_valid_with_both_tpot_groups(url: str) -> None:
    # seed 16: two sessions (4 turns and 2) in parallel, each ending with a free turn
    command = [*FLEETCTL, "bench", "--url", url, "--trace", "agent", "--requests", "6", "--rate", "0", "--seed", "16",
               "--json"]
    runs = {flag: subprocess.Popen([*command, flag], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            for flag in ("--tools", "--response-format")}
    for flag, run in runs.items():
        stdout, stderr = run.communicate(timeout=300)
        assert run.returncode == 0, stderr
        summary = json.loads(stdout)
        assert summary["agent_api"] == flag.removeprefix("--").replace("-", "_")
        assert summary["errors"] == 0 and summary["requests"] == 6
        assert summary["constrained_requests"] >= 1 and summary["schema_valid_rate"] == 1.0, summary
        assert summary["tpot_constrained_s"]["p50"] > 0 and summary["tpot_unconstrained_s"]["p50"] > 0, summary
