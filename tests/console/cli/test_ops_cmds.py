"""`fleetctl start`, `drain`, `resume`, `stop` (typer's CliRunner) against a real HTTP server in this
process on a fleet of in-process fake workers (tests/support/fake_workers.py): what they print, `--json`, and one
error line with a non-zero exit for a refusal or a drain that a resume called off."""

import json
import re
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
from support.fake_fleet_server import fake_fleet_url
from support.fleet_harness import wait_until
from typer.testing import CliRunner, Result

from fleetctl.console.cli.app import app
from fleetctl.engine.api.admin_token import read_admin_token


@pytest.fixture
def url(tiny_model_dir: Path, tmp_path: Path) -> Iterator[str]:
    with fake_fleet_url(tiny_model_dir, tmp_path) as served:
        yield served


def fleetctl(*args: str) -> Result:
    return CliRunner().invoke(app, list(args))


def worker(url: str, wid: str) -> dict:
    return next(w for w in httpx.get(f"{url}/fleet/workers", timeout=10).json()["workers"] if w["id"] == wid)


def test_pool_change_commands_print_their_results(url: str) -> None:
    started = fleetctl("start", "--role", "decode", "--device", "cpu:3", "--url", url)
    assert started.exit_code == 0, started.stderr
    assert re.fullmatch(r"decode-2 started on cpu:3 \(pid \d+\) in \d+\.\d s, \d+\.\d s of it loading the model\n",
                        started.stdout)
    drained = fleetctl("drain", "decode-2", "--url", url, "--json")
    assert drained.exit_code == 0 and json.loads(drained.stdout)["sessions_finished"] == 0
    assert worker(url, "decode-2")["state"] == "draining"
    resumed = fleetctl("resume", "decode-2", "--url", url)
    assert resumed.stdout == "decode-2 takes new work again\n"
    stopped = fleetctl("stop", "decode-2", "--force", "--url", url)
    assert re.fullmatch(r"decode-2 stopped: 0 session\(s\) finished, 0 moved to peers, \d+\.\d s\n", stopped.stdout)
    assert worker(url, "decode-2")["state"] == "stopped"

    refused = fleetctl("stop", "decode-2", "--url", url, "--json")
    assert refused.exit_code == 1 and refused.stdout == ""
    assert refused.stderr == ("fleetctl: error: POST /fleet/workers/decode-2/stop: HTTP 409: decode-2 is stopped, "
                              "not running\n")
    bad_role = fleetctl("start", "--role", "gpu", "--device", "cpu:3", "--url", url)
    assert bad_role.exit_code == 2 and "'gpu' is not one of" in bad_role.stderr


def test_timeouts_and_called_off_drains_fail_with_the_reason(url: str) -> None:
    """The streams and the resumer run in a pool: what fails in them fails the test (`result()` raises it)."""
    def stream(prompt: list[int]) -> None:
        body = {"model": "tiny-llama0", "prompt": prompt, "max_tokens": 500, "ignore_eos": True, "stream": True}
        with httpx.stream("POST", f"{url}/v1/completions", json=body, timeout=60) as response:
            response.raise_for_status()
            response.read()

    def resume_once_draining() -> None:
        assert wait_until(lambda: worker(url, "decode-1")["state"] == "draining", 30)
        httpx.post(f"{url}/fleet/workers/decode-1/resume", timeout=10,
                   headers={"Authorization": f"Bearer {read_admin_token()}"}).raise_for_status()

    with ThreadPoolExecutor(max_workers=9) as pool:
        streams = [pool.submit(stream, [5 + i, 6, 7]) for i in range(8)]
        assert wait_until(lambda: worker(url, "decode-0")["sessions"] >= 1 and worker(url, "decode-1")["sessions"] >= 1,
                          30)
        followed = fleetctl("drain", "decode-0", "--url", url, "--timeout", "0.2")
        assert followed.exit_code == 1
        running = re.fullmatch(
            r"fleetctl: error: drain of decode-0 still running after 0s \(operation (op-[0-9a-f]+)\)\n",
            followed.stderr)
        assert running, followed.stderr
        resumed = fleetctl("resume", "decode-0", "--url", url)
        assert resumed.stdout == f"decode-0 takes new work again (operation {running.group(1)} called off)\n"

        resumer = pool.submit(resume_once_draining)
        stopped = fleetctl("stop", "decode-1", "--url", url)
        resumer.result(30)
        for streamed in streams:
            streamed.result(60)
    assert stopped.exit_code == 1
    assert re.fullmatch(r"fleetctl: error: stop of decode-1 called off: decode-1 was resumed with \d+ session\(s\) "
                        r"left to drain\n", stopped.stderr), stopped.stderr
    assert worker(url, "decode-1")["state"] == "running"


def test_checkpoint_checkpoints_and_a_refused_replay(url: str) -> None:
    saved = fleetctl("checkpoint", "decode-1", "--hold", "300", "--url", url, "--json")
    assert saved.exit_code == 0, saved.stderr
    result = json.loads(saved.stdout)
    assert set(result) == {"worker", "path", "checkpoint", "sessions", "bytes", "seconds"}
    name = Path(result["checkpoint"]).name
    listed = json.loads(fleetctl("checkpoints", "--url", url, "--json").stdout)["checkpoints"]
    [row] = [row for row in listed if row["name"] == name]
    assert row["checkpoint"] == result["checkpoint"] and row["valid"] and row["used_at"] is None
    restored = fleetctl("restore", name, "--device", "cpu:4", "--url", url, "--json")
    assert restored.exit_code == 0, restored.stderr
    assert json.loads(restored.stdout)["checkpoint"] == result["checkpoint"]
    table = fleetctl("checkpoints", "--url", url)
    line = next(line for line in table.stdout.splitlines() if line.startswith(name))
    assert re.search(r"decode-1 +decode +0 .* \d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ$", line), line

    assert fleetctl("stop", "decode-1", "--url", url).exit_code == 0
    again = fleetctl("restore", name, "--device", "cpu:4", "--url", url)
    assert again.exit_code == 1 and "HTTP 409" in again.stderr and "restored already" in again.stderr
    assert "--force replays it deliberately" in again.stderr
    forced = fleetctl("restore", name, "--device", "cpu:4", "--force", "--url", url)
    assert forced.exit_code == 0, forced.stderr
    assert worker(url, "decode-1")["state"] == "running"


def test_checkpoint_prints_its_path_first_then_the_sentence(url: str) -> None:
    """`checkpoint` prints the checkpoint's path (DESIGN §2) on a line of its own, first: scripts read it."""
    saved = fleetctl("checkpoint", "decode-1", "--url", url)
    assert saved.exit_code == 0, saved.stderr
    path, sentence = saved.stdout.splitlines()
    assert Path(path).is_dir() and Path(path).name.startswith("decode-1-")
    assert re.fullmatch(rf"decode-1: \d+ session\(s\) saved to {re.escape(path)}, [\d,]+ bytes in \d+\.\d{{3}} s",
                        sentence), sentence
