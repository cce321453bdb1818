"""The `fleetctl` command line (typer). Heavy imports (torch) happen inside commands, so that
`fleetctl --help` stays fast."""

import typer

from fleetctl.console.devices_cmd import devices
from fleetctl.console.fleet_cmds import bench, classify, serve, status, workers
from fleetctl.console.generate_cmd import generate
from fleetctl.console.models_cmd import models_app
from fleetctl.console.ops_cmds import checkpoint, drain, migrate, restore, resume, start, stop

app = typer.Typer(
    name="fleetctl",
    help="Fleet console and serving engine for disaggregated LLM inference.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)
app.command("generate")(generate)
app.command("serve")(serve)
app.command("status")(status)
app.command("workers")(workers)
app.command("bench")(bench)
app.command("classify")(classify)
app.command("devices")(devices)
app.command("checkpoint")(checkpoint)
app.command("restore")(restore)
app.command("migrate")(migrate)
app.command("start")(start)
app.command("drain")(drain)
app.command("resume")(resume)
app.command("stop")(stop)
app.add_typer(models_app, name="models")


def main() -> None:
    app()
