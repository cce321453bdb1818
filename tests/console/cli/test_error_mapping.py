"""The CLI tells failures apart by their type, in one place (`Commands` in console/cli/app.py): an error of the
project (`FleetctlError`) that no code lists ends in one `fleetctl: error:` line, with its hint, and its exit
code; Ctrl-C in "interrupted" and 130; anything else is a bug and keeps its traceback."""

import pytest
import typer
from typer.testing import CliRunner, Result

from fleetctl.console.cli.app import Commands, main
from fleetctl.errors import FleetctlError, UserError

NO_FLEET = "127.0.0.1:9"  # discard port: nothing answers HTTP there


class NewMistake(UserError):
    """A user error that no command of fleetctl raises and no code lists."""


class Misuse(UserError):
    exit_code = 2


class Stuck(FleetctlError):
    hint = "wait for it, or pass --force"


tiny = typer.Typer(cls=Commands)


@tiny.command()
def refuse() -> None:
    raise NewMistake("the moon is not made of cheese")


@tiny.command()
def misuse() -> None:
    raise Misuse("--fast and --slow together")


@tiny.command()
def stuck() -> None:
    raise Stuck("decode-0 is busy")


@tiny.command()
def crash() -> None:
    raise ValueError("a bug")


@tiny.command()
def interrupt() -> None:
    raise KeyboardInterrupt


def run(command: str) -> Result:
    return CliRunner().invoke(tiny, [command])


def test_an_error_listed_nowhere_is_one_line_and_its_exit_code() -> None:
    refused = run("refuse")
    assert (refused.exit_code, refused.stdout, refused.stderr) == (
        1, "", "fleetctl: error: the moon is not made of cheese\n")
    assert run("misuse").exit_code == 2
    assert run("stuck").stderr == "fleetctl: error: decode-0 is busy: wait for it, or pass --force\n"


def test_a_bug_is_not_told_as_a_users_mistake() -> None:
    crashed = run("crash")
    assert isinstance(crashed.exception, ValueError)  # it leaves the CLI as itself: Python prints its traceback
    assert "fleetctl: error" not in crashed.stderr


def test_ctrl_c_is_interrupted_130() -> None:
    interrupted = run("interrupt")
    assert (interrupted.exit_code, interrupted.stderr) == (130, "fleetctl: error: interrupted\n")


def test_main_says_a_fleet_that_does_not_answer_with_what_to_run(monkeypatch: pytest.MonkeyPatch,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr("sys.argv", ["fleetctl", "status", "--url", NO_FLEET])
    with pytest.raises(SystemExit) as exited:
        main()
    assert exited.value.code == 1
    assert capsys.readouterr().err == (f"fleetctl: error: no fleet answers at http://{NO_FLEET} (ConnectError): "
                                       "start one with `fleetctl serve` or `fleetctl demo`, or point --url / "
                                       "$FLEET_URL at one\n")
