"""The chaos scenarios of scripts/chaos.py at a small size, on real fleets: a prefill worker killed after a
request's first token and before its KV is published, a decode worker killed while adopting one, SIGKILLed
and SIGSTOPped mid-stream, a step that hangs, a poisoned request, a restore that fails, the last decode
worker killed, a checkpoint that times out. Every request completes with exactly the text of an undisturbed
run (`--deterministic`: the continuation must not depend on batch composition) or ends with one clear error;
none is lost, no 5xx, no KV block or /dev/shm buffer is left."""

import asyncio
import importlib.util
from pathlib import Path

import pytest

pytestmark = pytest.mark.fleet  # real worker processes and a real server

REQUESTS, TOKENS = 6, 48
_spec = importlib.util.spec_from_file_location("chaos", Path(__file__).resolve().parents[2] / "scripts" / "chaos.py")
chaos = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(chaos)


@pytest.fixture(scope="module")
def expected(small_model_dir: Path) -> list[str]:
    return chaos.undisturbed(small_model_dir, chaos.prompts(REQUESTS), TOKENS)


@pytest.mark.parametrize("scenario", chaos.SCENARIOS, ids=lambda s: s.name.replace(" ", "-"))
def test_every_request_ends_and_nothing_leaks(small_model_dir: Path, expected: list[str], scenario) -> None:
    row = asyncio.run(chaos.run(scenario, small_model_dir, chaos.prompts(REQUESTS), expected, TOKENS))
    assert row.ok, (row, row.errors)
    assert row.faults >= 1 and row.completed + row.clean_errors == REQUESTS
    assert row.clean_errors == (scenario.targets if scenario.poisoned else 0), row.errors
