"""`fleetctl plan`, `classify` and `devices` read a metrics store file (`--store`) or ask a fleet (`--url`,
`$FLEET_URL`), through typer's CliRunner against a real HTTP server on 127.0.0.1 in this process whose fleet (fake
workers) keeps the same store file (tests/support/synthetic_fleet.py: ten minutes of rag-like traffic and two
device peaks): the same `--json` shape either way, which source wins, `devices`' table, and one error line with
exit 1 for a fleet that does not answer, keeps no store or refuses a parameter."""

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from support.fake_fleet_server import fake_fleet_url
from support.synthetic_fleet import T0, workload, write_device_peaks, write_store
from typer.testing import CliRunner, Result

from fleetctl.console.cli.app import app

NO_FLEET = "127.0.0.1:9"  # discard port: nothing answers HTTP there
REPORTS = [["plan", "--since", "1h", "--devices", "cpu:0,cpu:1,cpu:2"], ["classify", "--since", "1h"], ["devices"]]


def fleetctl(*args: str, env: dict[str, str | None] | None = None) -> Result:
    return CliRunner().invoke(app, list(args), env={"FLEET_URL": None} | (env or {}))


def shape(value: Any) -> Any:
    """The keys of every object in `value`, nested (a list: its items' distinct shapes); values left out."""
    if isinstance(value, dict):
        return {key: shape(item) for key, item in value.items()}
    if isinstance(value, list):
        return sorted({json.dumps(shape(item), sort_keys=True) for item in value})
    return "value"


def failed_with(result: Result, message: str) -> bool:
    return result.exit_code == 1 and result.stdout == "" and result.stderr == f"fleetctl: error: {message}\n"


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("reports") / "fleet.db"
    write_store(path, workload("rag", 60, 1.5), t0=time.time() - 600)
    write_device_peaks(path)
    return path


@pytest.fixture(scope="module")
def url(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory, store: Path) -> Iterator[str]:
    with fake_fleet_url(tiny_model_dir, tmp_path_factory.mktemp("fleet"), store) as served:
        yield served


@pytest.mark.parametrize("report", REPORTS, ids=lambda args: args[0])
def test_a_report_from_the_fleet_has_the_shape_of_the_store_files(report: list[str], store: Path, url: str) -> None:
    from_file = fleetctl(*report, "--store", str(store), "--json")
    from_fleet = fleetctl(*report, "--url", url, "--json")
    assert from_file.exit_code == 0 and from_fleet.exit_code == 0, from_file.stderr + from_fleet.stderr
    file_body, fleet_body = json.loads(from_file.stdout), json.loads(from_fleet.stdout)
    assert list(fleet_body) == list(file_body)
    fleet_text, file_text = fleetctl(*report, "--url", url).stdout, fleetctl(*report, "--store", str(store)).stdout
    if report[0] == "devices":  # a fleet adds its live workers and their weight formats; a file has none
        assert fleet_body.pop("workers") and file_body.pop("workers") == []
        assert fleet_text.startswith(file_text.rstrip("\n")) and "weights" in fleet_text.removeprefix(file_text)
        fleet_text = file_text
    assert shape(fleet_body) == shape(file_body)
    if report[0] != "plan":  # the plan's `current` is the fleet's live layout, not the store's last one
        assert fleet_body == file_body
        assert fleet_text == file_text


def test_devices_prints_the_peaks_table_and_its_json(store: Path) -> None:
    table = fleetctl("devices", "--store", str(store))
    assert table.exit_code == 0, table.stderr
    measured = [time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(at)) for at in (T0, T0 + 60)]
    assert table.stdout.splitlines() == [
        f"{'identity':<44} dtype      TFLOP/s     GB/s how         measured",
        f"{'cpu:Synthetic CPU:2threads:64MiB':<44} float32      0.250     20.0 calibrated  {measured[0]}",
        f"{'cuda:NVIDIA H200':<44} bfloat16   989.000   4800.0 spec-table  {measured[1]}"]
    body = json.loads(fleetctl("devices", "--store", str(store), "--json").stdout)
    assert body == {"not_recalibrated": [], "workers": [], "devices": [
        {"identity": "cpu:Synthetic CPU:2threads:64MiB", "dtype": "float32", "kind": "cpu", "name": "Synthetic CPU",
         "peak_flops": 2.5e11, "peak_bytes_per_s": 2e10, "how": "calibrated", "measured_at": T0},
        {"identity": "cuda:NVIDIA H200", "dtype": "bfloat16", "kind": "cuda", "name": "NVIDIA H200",
         "peak_flops": 9.89e14, "peak_bytes_per_s": 4.8e12, "how": "spec-table", "measured_at": T0 + 60}]}


def test_devices_of_a_store_without_peaks_says_so(tmp_path: Path) -> None:
    empty = tmp_path / "fleet.db"
    write_store(empty, workload("rag", 3, 1.5))
    result = fleetctl("devices", "--store", str(empty))
    assert result.exit_code == 0, result.stderr
    assert result.stdout.splitlines()[0] == "no device measured yet: workers measure their device when a fleet starts"
    assert json.loads(fleetctl("devices", "--store", str(empty), "--json").stdout) == {"devices": [], "workers": [],
                                                                                       "not_recalibrated": []}


def test_store_wins_then_the_fleet_url_then_the_default_store(store: Path, url: str, tmp_path: Path) -> None:
    home = {"FLEET_HOME": str(tmp_path)}  # its default store, fleet.db, does not exist
    asked = fleetctl("classify", "--since", "1h", "--json", env=home | {"FLEET_URL": url})
    assert asked.exit_code == 0 and json.loads(asked.stdout)["requests"] == 60, asked.stderr
    read = fleetctl("classify", "--store", str(tmp_path / "other.db"), env=home | {"FLEET_URL": url})
    assert failed_with(read, f"no metrics store at {tmp_path / 'other.db'} (run a fleet with `fleetctl serve` "
                             "first, or pass --store)")
    default = fleetctl("devices", env=home)
    assert failed_with(default, f"no metrics store at {tmp_path / 'fleet.db'} (workers measure their devices when "
                                "a fleet starts)")


@pytest.mark.parametrize(("args", "message"), [
    (["classify", "--since", "forever"], "GET /fleet/classify: HTTP 400: bad --since 'forever': use e.g. 90s, 10m, "
                                         "2h, 1d"),
    (["plan", "--slo-ttft", "2x"], "GET /fleet/plan: HTTP 400: bad --slo-ttft '2x': use e.g. 2s, 200ms or 0.2 "
                                   "(seconds, > 0)"),
    (["plan", "--trace", "trace.jsonl"], "--trace replays a file on this machine: plan it from a store file "
                                         "(--store), not from a fleet"),
    (["devices", "--recalibrate"], "--recalibrate measures this machine's CPUs into a store file: pass --store, "
                                   "not a fleet's URL"),
    (["classify", "--store", "fleet.db"], "--store reads a store file and --url asks a fleet: give one of them"),
])
def test_a_fleet_refusal_is_one_line(url: str, args: list[str], message: str) -> None:
    assert failed_with(fleetctl(*args, "--url", url), message)


@pytest.mark.parametrize("report", REPORTS, ids=lambda args: args[0])
def test_no_fleet_and_a_fleet_without_a_store_are_one_line(report: list[str], tiny_model_dir: Path,
                                                           tmp_path: Path) -> None:
    unreachable = fleetctl(*report, "--url", NO_FLEET)
    assert failed_with(unreachable, f"no fleet answers at http://{NO_FLEET} (ConnectError): start one with "
                                    "`fleetctl serve` or `fleetctl demo`, or point --url / $FLEET_URL at one")
    has_none = {"plan": "nothing to plan from", "classify": "no traffic to classify", "devices": "no device peaks"}
    with fake_fleet_url(tiny_model_dir, tmp_path) as storeless:
        refused = fleetctl(*report, env={"FLEET_URL": storeless})
    assert failed_with(refused, f"GET /fleet/{report[0]}: HTTP 404: this fleet keeps no metrics store, so it has "
                                f"{has_none[report[0]]}")
