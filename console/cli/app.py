"""The `fleetctl` command line (typer). Heavy imports (torch) happen inside commands, so that
`fleetctl --help` stays fast."""

import sys
from importlib.metadata import version
from typing import Any

import typer
from typer.core import TyperGroup

from fleetctl.console.cli.bench import bench
from fleetctl.console.cli.common import EXIT_INTERRUPTED
from fleetctl.console.cli.console import console
from fleetctl.console.cli.demo import demo
from fleetctl.console.cli.devices import devices
from fleetctl.console.cli.generate import generate
from fleetctl.console.cli.models import models_app
from fleetctl.console.cli.ops import (
    checkpoint,
    checkpoints,
    drain,
    migrate,
    move,
    restore,
    resume,
    start,
    stop,
    switch,
)
from fleetctl.console.cli.planning import classify, plan, rebalance
from fleetctl.console.cli.serve import serve
from fleetctl.console.cli.status import status, workers
from fleetctl.errors import FleetctlError

try:  # newer typer vendors click
    from typer import _click as click
    from typer._click import exceptions as cli_errors
except ImportError:
    import click
    from click import exceptions as cli_errors


def say_error(message: str) -> None:
    print(f"fleetctl: error: {message}", file=sys.stderr)


class Commands(TyperGroup):
    """fleetctl's commands, whose failures are told apart by type here, in one place: an expected one (any
    `FleetctlError`, from the engine, the store, a fleet that does not answer or refuses, or the command itself)
    ends in one `fleetctl: error:` line, its hint, and its `exit_code`; Ctrl-C in "interrupted", 130. Anything
    else is a bug and keeps its traceback. Here rather than in `main` so that typer's CliRunner sees what a user
    sees."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except FleetctlError as exc:
            say_error(f"{exc}: {exc.hint}" if exc.hint else str(exc))
            raise typer.Exit(exc.exit_code) from None
        except KeyboardInterrupt:
            say_error("interrupted")
            raise typer.Exit(EXIT_INTERRUPTED) from None


app = typer.Typer(
    cls=Commands,
    name="fleetctl",
    help="Fleet console and serving engine for disaggregated LLM inference.\n\n"
         "Start here: `fleetctl demo` (a fleet on the default model, synthetic traffic and the console), "
         "`fleetctl serve` (a fleet with an OpenAI-compatible API on 127.0.0.1:8700), or "
         "`fleetctl generate \"Hello\"` (one answer, no fleet). `fleetctl` alone on a terminal opens the console.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)


def show_version(value: bool) -> None:
    if value:
        print(f"fleetctl {version('fleetctl')}")
        raise typer.Exit()


@app.callback()
def options(_: bool = typer.Option(False, "--version", callback=show_version, is_eager=True,
                                   help="Print the version and exit.")) -> None:
    """Fleet console and serving engine for disaggregated LLM inference."""

app.command("console")(console)
app.command("generate")(generate)
app.command("serve")(serve)
app.command("demo")(demo)
app.command("status")(status)
app.command("workers")(workers)
app.command("bench")(bench)
app.command("classify")(classify)
app.command("plan")(plan)
app.command("rebalance")(rebalance)
app.command("devices")(devices)
app.command("checkpoint")(checkpoint)
app.command("restore")(restore)
app.command("checkpoints")(checkpoints)
app.command("migrate")(migrate)
app.command("move")(move)
app.command("start")(start)
app.command("drain")(drain)
app.command("resume")(resume)
app.command("stop")(stop)
app.command("switch")(switch)
app.add_typer(models_app, name="models")


def untyped_flags(command: click.Command, ctx: click.Context) -> None:
    """Help shows a flag (`--json`, `--help`, `--force`) by its name alone: typer's rich help labels each
    one `<bool>`, as if it took a value."""
    for param in [*command.params, command.get_help_option(ctx)]:
        if getattr(param, "is_flag", False):  # an option (arguments have no is_flag) that takes no value
            param.metavar = ""
    for sub in getattr(command, "commands", {}).values():
        untyped_flags(sub, ctx)


OPTIONAL_VALUES = {"--ray": "auto"}  # options whose value may be left out (typer's parser has none of their kind)


def fill_optional_values(args: list[str]) -> list[str]:
    """`args` with each value-less OPTIONAL_VALUES option given its default: `serve --ray` means `--ray auto`."""
    filled = []
    for at, arg in enumerate(args):
        filled.append(arg)
        if arg in OPTIONAL_VALUES and (at + 1 == len(args) or args[at + 1].startswith("-")):
            filled.append(OPTIONAL_VALUES[arg])
    return filled


def main() -> None:
    """Run the CLI; a usage error (unknown option, bad value) is one `fleetctl: error:` line, exit 2."""
    if len(sys.argv) == 1 and sys.stdin.isatty() and sys.stdout.isatty():
        sys.argv.append("console")  # `fleetctl` alone on a terminal opens the console
    command = typer.main.get_command(app)
    untyped_flags(command, click.Context(command))
    try:
        # standalone_mode=False: an Exit comes back as its code
        code = command.main(fill_optional_values(sys.argv[1:]), prog_name="fleetctl", standalone_mode=False)
        if isinstance(code, int):
            sys.exit(code)
    except cli_errors.NoArgsIsHelpError as exc:
        print(exc.ctx.get_help() if exc.ctx else "")
    except cli_errors.UsageError as exc:
        where = f" (see `{exc.ctx.command_path} --help`)" if exc.ctx else ""
        say_error(f"{exc.format_message().replace('Value error, ', '')}{where}")
        sys.exit(exc.exit_code)
    except typer.Exit as exc:
        sys.exit(exc.exit_code)
    except typer.Abort:
        say_error("interrupted")
        sys.exit(EXIT_INTERRUPTED)
