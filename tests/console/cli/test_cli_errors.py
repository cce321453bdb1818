"""Every mistake a user can make on the command line ends in one `fleetctl: error:` line on stderr and a
non-zero exit — never a traceback — and the everyday commands behave as their help says."""

import re
import socket
from pathlib import Path

import pytest
from support.fleet_harness import fleetctl

from fleetctl.console.cli.app import fill_optional_values

pytestmark = pytest.mark.fleet  # each case is a fresh `python -m fleetctl.console` process

NO_FLEET = "127.0.0.1:9"  # discard port: nothing answers HTTP there; no scheme on purpose


@pytest.mark.parametrize("args", [
    ["generate", "--dtype", "fp8", "hello"],
    ["serve", "--dtype", "fp8"],
    ["bench", "--url", NO_FLEET],
    ["bench", "--requests", "0"],
    ["bench", "--trace", "nonsense"],
    ["status", "--url", NO_FLEET],
    ["workers", "--url", NO_FLEET, "--json"],
    ["migrate", "decode-0", "--url", NO_FLEET, "--to", "cpu:3"],
    ["migrate", "decode-0"],
    ["no-such-command"],
    ["classify", "--since", "ten minutes"],
    ["classify", "--url", NO_FLEET],
    ["plan", "--url", NO_FLEET, "--json"],
    ["devices", "--url", NO_FLEET],
    ["devices", "--recalibrate", "--url", NO_FLEET],
    ["serve", "--devices", "gpu:0,cpu:1"],
    ["generate", "--quantization", "int5", "hello"],
    ["serve", "--quant-group-size", "48"],
])
def test_a_bad_invocation_is_one_line(args: list[str]) -> None:
    result = fleetctl(*args, timeout=60)
    assert result.returncode != 0
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("fleetctl: error: "), result.stderr
    assert "Traceback" not in result.stdout


def test_no_fleet_error_says_where_and_what_to_run() -> None:
    message = fleetctl("status", "--url", NO_FLEET).stderr
    assert f"http://{NO_FLEET}" in message and "fleetctl serve" in message


def test_a_taken_port_fails_before_anything_else(tmp_path: Path) -> None:
    """The port is checked first: with a model that does not even exist, the error is still the port's."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = fleetctl("serve", "--model", str(tmp_path / "no-such-model"), "--port", str(port), timeout=60)
    assert result.returncode != 0 and "is in use" in result.stderr and len(result.stderr.strip().splitlines()) == 1


def test_a_group_size_the_model_cannot_take_is_one_line(tiny_model_dir: Path) -> None:
    result = fleetctl("generate", "--model", str(tiny_model_dir), "--quantization", "int4", "--quant-group-size", "128",
                      "hello", timeout=120)
    assert result.returncode == 1
    assert result.stderr.strip().splitlines() == [
        "fleetctl: error: --quantization int4: int4 needs in_features divisible by the group size: 64 by 128"]


def test_generate_several_prompts_prints_each_under_its_prompt(tiny_model_dir: Path) -> None:
    result = fleetctl("generate", "--model", str(tiny_model_dir), "--max-tokens", "4", "first", "second")
    assert result.returncode == 0, result.stderr
    headers = [line for line in result.stdout.splitlines() if line.startswith("--- ")]
    assert [h.split("'")[1] for h in headers] == ["first", "second"]


def test_generate_reads_prompts_from_stdin(tiny_model_dir: Path) -> None:
    import subprocess

    from fleetctl.console.loadgen.local_fleet import FLEETCTL

    result = subprocess.run([*FLEETCTL, "generate", "--model", str(tiny_model_dir), "--max-tokens", "3", "--json", "-"],
                            input="one\n\ntwo\nthree\n", capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert len(result.stdout.splitlines()) == 3


def test_version_and_help() -> None:
    assert fleetctl("--version").stdout.startswith("fleetctl ")
    helped = fleetctl()
    assert helped.returncode == 0 and "fleetctl demo" in helped.stdout  # not a TTY: help that says where to start


COMMANDS = ["console", "generate", "serve", "demo", "status", "workers", "bench", "classify", "plan", "rebalance",
            "devices", "checkpoint", "restore", "checkpoints", "migrate", "start", "drain", "resume", "stop",
            "models list", "models pull"]


def test_help_reads_as_a_newcomer_needs() -> None:
    """No flag labelled `<bool>` as if it took a value; every timeout and duration says its unit; `checkpoint`
    says what happens to its sessions after `--hold`."""
    for name in COMMANDS:
        helped = fleetctl(*name.split(), "--help", env={"COLUMNS": "200"})
        assert helped.returncode == 0, (name, helped.stderr)
        assert "<bool>" not in helped.stdout, name
        for line in helped.stdout.splitlines():
            if re.search(r"--[\w-]*timeout\b|--hold\b|--grace\b", line):
                assert "Seconds" in line or "seconds" in line, (name, line)
    checkpoint = " ".join(fleetctl("checkpoint", "--help", env={"COLUMNS": "200"}).stdout.split())
    assert "recomputed on peers after `--hold` seconds" in checkpoint


def test_generate_on_a_terminal_shows_speed_dtype_and_device_after_the_answer(tiny_model_dir: Path) -> None:
    import os
    import pty
    import subprocess

    from fleetctl.console.loadgen.local_fleet import FLEETCTL

    controller, terminal = pty.openpty()
    try:
        result = subprocess.run([*FLEETCTL, "generate", "--model", str(tiny_model_dir), "--max-tokens", "4",
                                 "--dtype", "float32", "hello"], stdout=subprocess.PIPE, stderr=terminal,
                                text=True, timeout=120)
        os.close(terminal)
        shown = b""
        while chunk := _read_or_eof(controller):
            shown += chunk
    finally:
        os.close(controller)
    assert result.returncode == 0
    line = shown.decode().strip().splitlines()[-1]
    assert "tokens/s" in line and "float32 on cpu" in line and "first token" in line, line
    plain = fleetctl("generate", "--model", str(tiny_model_dir), "--max-tokens", "4", "hello")
    assert "tokens/s" not in plain.stderr  # not a terminal: the answer alone


def _read_or_eof(fd: int) -> bytes:
    import os

    try:
        return os.read(fd, 4096)
    except OSError:  # the terminal's other end closed: all read
        return b""


@pytest.mark.parametrize(("args", "said"), [
    (["--ray", NO_FLEET], f"cannot join the Ray cluster at {NO_FLEET}: nothing answers"),
    (["--ray", "nonsense"], "a Ray address is HOST:PORT or auto"),
    (["--devices", "node2/cpu:0,cpu:1"], "node2/cpu:0 names a node of a Ray cluster: serve the fleet with --ray"),
])
def test_ray_mistakes_are_one_line(tiny_model_dir: Path, args: list[str], said: str) -> None:
    result = fleetctl("serve", "--model", str(tiny_model_dir), "--port", "0", *args, timeout=120)
    lines = result.stderr.strip().splitlines()
    assert result.returncode != 0 and len(lines) == 1 and said in lines[0], result.stderr


@pytest.mark.parametrize(("args", "filled"), [
    (["serve", "--ray"], ["serve", "--ray", "auto"]),
    (["serve", "--ray", "--devices", "cpu:0"], ["serve", "--ray", "auto", "--devices", "cpu:0"]),
    (["serve", "--ray", "10.0.0.2:6379"], ["serve", "--ray", "10.0.0.2:6379"]),
    (["serve", "--ray=auto"], ["serve", "--ray=auto"]),
])
def test_ray_without_an_address_is_auto(args: list[str], filled: list[str]) -> None:
    assert fill_optional_values(args) == filled
