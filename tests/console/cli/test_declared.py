"""Typer options derived from the settings models' declarations (console/cli/declared.py): `serve`, `generate` and
`console` keep every option they had, with its default, bounds and environment variable; a command line's values
build the settings the old command bodies built (MiB and GB to bytes, 0 and "" to None, comma lists, the SLO pair,
one format per role, the heartbeat from its timeout); bounds and choices are refused in one usage line."""

from enum import Enum
from pathlib import Path
from typing import Any

import pytest
import typer
from typer.testing import CliRunner

from fleetctl.console.cli.app import app, fill_optional_values
from fleetctl.console.cli.declared import Options, shared_option, with_options
from fleetctl.console.cli.generate import FLEET_ONLY, ONE_SHOT
from fleetctl.domain import Quantization, WorkerRole
from fleetctl.engine.core.engine_settings import CompileMode, EngineConfig, EngineSettings, this_machines_device
from fleetctl.engine.core.sequence import SamplingParams
from fleetctl.engine.fleet.fleet_config import FleetConfig, Supervision
from fleetctl.engine.paths import default_store_path
from fleetctl.engine.planner.autoplan_settings import AutoplanSettings
from fleetctl.engine.planner.slo import Slo
from fleetctl.engine.server.server_settings import ServerSettings
from fleetctl.options import build

# each command's options and defaults before they were derived (add, never rename or drop: DESIGN §2)
BEFORE = {
    "serve": {
        "--model": "smollm2-135m", "--prefill": 1, "--decode": 1, "--colocated": 0, "--devices": "", "--host":
        "127.0.0.1", "--port": 8700, "--dtype": "auto", "--deterministic": False, "--quantization": "none",
        "--prefill-quantization": None, "--decode-quantization": None, "--quant-group-size": 32, "--prefix-cache":
        True, "--local-prefill-tokens": 128, "--kv-memory": 0, "--kv-blocks": 0, "--kv-offload-memory": 0,
        "--kv-offload-dir": None, "--kv-offload-gb": 0.0, "--kv-offload-policy": "evict", "--session-ttl": 0.0,
        "--kv-offload-host-dir": None, "--otlp-endpoint": "", "--store": "", "--store-reset": False, "--max-queue":
        256, "--limit-concurrency": 0, "--max-num-seqs": 64, "--max-num-batched-tokens": 4096, "--max-model-len": 0,
        "--compile": "off", "--served-model-name": "", "--api-key": "", "--access-log": True, "--grace": 20.0,
        "--restart": True, "--heartbeat-timeout": 10.0, "--step-timeout": 120.0, "--checkpoint-timeout": 300.0,
        "--autoplan": False, "--autoplan-interval": 60.0, "--min-gain": 10.0, "--autoplan-slo": "2s,200ms",
        "--max-workers": 0, "--autoplan-hysteresis": 300.0, "--ray": "",
    },
    "generate": {
        "--model": "smollm2-135m", "--max-tokens": 64, "--temperature": 0.0, "--top-p": 1.0, "--top-k": 0, "--seed":
        None, "--stop": [], "--ignore-eos": False, "--chat": False, "--dtype": "auto", "--quantization": "none",
        "--quant-group-size": 32, "--device": "", "--deterministic": False, "--prefix-cache": True, "--compile":
        "off", "--json": False,
    },
    "console": {
        "--url": None, "--token": None, "--store": "", "--readonly": False, "--theme": None, "--interval": None,
        "--model": "smollm2-135m", "--quantization": "none", "--web": False, "--port": 8710,
    },
}
BOUNDS = {  # (min, max) of the options that had them
    "--local-prefill-tokens": (0, None), "--kv-memory": (0, None), "--kv-blocks": (0, None),
    "--kv-offload-memory": (0, None), "--kv-offload-gb": (0.0, None), "--session-ttl": (0.0, None),
    "--max-queue": (0, None), "--limit-concurrency": (0, None), "--max-num-seqs": (1, None),
    "--max-num-batched-tokens": (16, None), "--max-model-len": (0, None), "--grace": (0.0, None),
    "--heartbeat-timeout": (0.1, None), "--step-timeout": (0.1, None), "--checkpoint-timeout": (0.1, None),
    "--autoplan-interval": (1.0, None), "--min-gain": (0.0, None), "--max-workers": (0, None),
    "--autoplan-hysteresis": (0.0, None), "--interval": (0.2, 60.0),
}
ENV = {"--compile": "FLEET_COMPILE", "--api-key": "FLEET_API_KEY"}
SERVE = (Options(FleetConfig), Options(ServerSettings))


def invoked(*groups: Options, args: tuple[str, ...] = (), env: dict[str, str] | None = None) -> dict[str, Any]:
    """The option values a command taking `groups`' options receives from `args`."""
    received: dict[str, Any] = {}

    @with_options(*groups)
    def command(values: dict[str, Any]) -> None:
        received.update(values)

    cli = typer.Typer()
    cli.command()(command)
    result = CliRunner().invoke(cli, fill_optional_values(list(args)), env=env)  # as `main` passes them
    assert result.exit_code == 0, result.output
    return received


def refused(*args: str) -> str:
    """What a command taking serve's options says of `args` it refuses (a usage error, exit 2)."""
    @with_options(*SERVE)
    def command(values: dict[str, Any]) -> None:
        raise AssertionError(f"{args} were accepted")

    cli = typer.Typer()
    cli.command()(command)
    result = CliRunner().invoke(cli, list(args))
    assert result.exit_code == 2, result.output
    return " ".join(result.output.split())


@pytest.mark.parametrize("name", list(BEFORE))
def test_every_option_keeps_its_name_default_bounds_and_environment_variable(name: str) -> None:
    params = {p.opts[0]: p for p in typer.main.get_command(app).commands[name].params if p.opts[0].startswith("--")}
    for flag, default in BEFORE[name].items():
        param = params[flag]
        now = param.default.value if isinstance(param.default, Enum) else param.default
        assert now == default, (name, flag)
        assert (param.min, param.max) == BOUNDS.get(flag, (None, None)), (name, flag)
        if flag in ENV:
            assert param.envvar == ENV[flag], (name, flag)


def test_serve_s_defaults_build_the_settings_the_models_declare(tmp_path: Path) -> None:
    values = invoked(*SERVE)
    assert build(FleetConfig, values, model_dir=tmp_path) == FleetConfig(tmp_path, store_path=default_store_path())
    assert build(ServerSettings, values) == ServerSettings()


def test_serve_s_options_convert_to_the_fleet_s_units(tmp_path: Path) -> None:
    values = invoked(*SERVE, args=(
        "--devices", "cpu:0, cpu:1,,cpu:2", "--kv-memory", "512", "--kv-blocks", "0", "--max-model-len", "100",
        "--kv-offload-memory", "64", "--kv-offload-dir", str(tmp_path), "--kv-offload-gb", "1.5",
        "--prefill-quantization", "int8", "--heartbeat-timeout", "2", "--autoplan", "--autoplan-slo", "1s,50ms",
        "--max-workers", "3", "--store", str(tmp_path / "f.db"), "--served-model-name", "house", "--no-restart",
        "--ray", "--api-key", "k"))
    config = build(FleetConfig, values, model_dir=tmp_path)
    assert config.devices == ("cpu:0", "cpu:1", "cpu:2") and config.store_path == tmp_path / "f.db"
    assert config.engine == EngineSettings(kv_memory_bytes=512 * 2**20, max_model_len=100,
                                           kv_offload_memory_bytes=64 * 2**20, kv_offload_dir=tmp_path,
                                           kv_offload_disk_bytes=1_500_000_000)
    assert config.role_quantization == ((WorkerRole.PREFILL, Quantization.INT8),)
    assert config.supervision == Supervision(restart=False, heartbeat_s=0.5, heartbeat_timeout_s=2.0)
    assert config.autoplan == AutoplanSettings(slo=Slo(1.0, 0.05), max_workers=3)
    assert (config.served_model_name, config.otlp_endpoint) == ("house", None)
    server = build(ServerSettings, values)
    assert (server.ray, server.api_key, server.limit_concurrency) == ("auto", "k", 0)  # `--ray` alone is `--ray auto`


def test_environment_variables_set_what_their_options_do() -> None:
    values = invoked(*SERVE, env={"FLEET_API_KEY": "from-env", "FLEET_COMPILE": "on"})
    assert build(ServerSettings, values).api_key == "from-env"
    assert build(EngineSettings, values).compile is CompileMode.ON


@pytest.mark.parametrize(("args", "said"), [
    (("--kv-memory", "-1"), "--kv-memory"),
    (("--heartbeat-timeout", "0"), "--heartbeat-timeout"),
    (("--quant-group-size", "48"), "must be one of 32, 64, 128"),
    (("--dtype", "fp8"), "--dtype"),
])
def test_bounds_and_choices_are_usage_errors(args: tuple[str, ...], said: str) -> None:
    assert said in refused(*args)


def test_generate_s_defaults_are_a_one_shot_s(tmp_path: Path) -> None:
    values = invoked(Options(EngineConfig, exclude=FLEET_ONLY), Options(SamplingParams, defaults=ONE_SHOT))
    assert not {"kv_offload_memory", "session_ttl"} & set(values)
    assert build(SamplingParams, values) == SamplingParams(max_tokens=64, temperature=0.0)
    assert build(EngineConfig, values, model_dir=tmp_path) == EngineConfig(tmp_path, this_machines_device(""))
    stops = invoked(Options(SamplingParams), args=("--stop", "a", "--stop", "b", "-n", "3"))
    assert build(SamplingParams, stops) == SamplingParams(max_tokens=3, stop=("a", "b"))


def test_an_option_declared_twice_for_one_command_is_refused() -> None:
    with pytest.raises(ValueError, match="declared twice"):
        with_options(Options(FleetConfig), Options(EngineConfig))


def test_a_shared_option_is_its_declaration_s() -> None:
    quantization = shared_option(EngineSettings, "quantization")
    assert (quantization.default, quantization.param_decls) == (Quantization.NONE, ("--quantization",))
