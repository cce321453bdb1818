"""Typer options derived from the settings models' declarations (`fleetctl.options`): a command names the models
it configures and receives the values of their options; their flags, help, defaults, bounds and environment
variables are the declarations'."""

import functools
import inspect
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import typer

from fleetctl.options import Placed, placed

Command = Callable[..., None]


@dataclass(frozen=True)
class Options:
    """The options of one settings model on a command: `exclude` leaves some out (by name), `defaults` gives the
    command's own default for some (by name), `panel` titles their section of the help."""

    model: type
    panel: str | None = None
    exclude: tuple[str, ...] = ()
    defaults: Mapping[str, Any] = field(default_factory=dict)

    def placed(self) -> list[Placed]:
        shown = [p for p in placed(self.model, self.panel) if p.option.name not in self.exclude]
        return [Placed(p.option, p.type, self.defaults.get(p.option.name, p.default), p.panel) for p in shown]


def one_of(choices: tuple[Any, ...]) -> Callable[[Any], Any]:
    """A typer callback refusing a value that is not one of `choices`."""

    def check(value: Any) -> Any:
        if value not in choices:
            raise typer.BadParameter(f"must be one of {', '.join(map(str, choices))}")
        return value

    return check


def typer_option(option: Placed) -> Any:
    """The `typer.Option(...)` of a declared option."""
    declared = option.option
    return typer.Option(option.default, *declared.flags, help=declared.help, min=declared.min, max=declared.max,
                        envvar=declared.envvar, metavar=declared.metavar, rich_help_panel=option.panel,
                        callback=one_of(declared.choices) if declared.choices else None)


def shared_option(model: type, name: str) -> Any:
    """The `typer.Option(...)` of `model`'s option `name`, for a command that takes it alone."""
    return typer_option(next(p for p in placed(model) if p.option.name == name))


def with_options(*groups: Options) -> Callable[[Command], Command]:
    """A decorator: the command takes `groups`' options beside its own parameters, and receives their values as
    its first argument, a dict keyed by option name (`fleetctl.options.build` makes a model of them)."""
    shown = [option for group in groups for option in group.placed()]
    names = [option.option.name for option in shown]
    if len(set(names)) != len(names):
        raise ValueError(f"options declared twice for one command: {sorted({n for n in names if names.count(n) > 1})}")

    def derive(command: Command) -> Command:
        own = list(inspect.signature(command).parameters.values())[1:]

        @functools.wraps(command)
        def run(**given: Any) -> None:
            values = {name: given.pop(name) for name in names}
            command(values, **given)

        declared = [inspect.Parameter(option.option.name, inspect.Parameter.KEYWORD_ONLY,
                                      default=typer_option(option), annotation=option.type) for option in shown]
        run.__signature__ = inspect.Signature([*own, *declared])  # what typer reads the command's options from
        return run

    return derive
