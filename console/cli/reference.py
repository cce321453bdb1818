"""docs/cli.md, generated from the typer app: one `## fleetctl <command>` section per command and sub-command with
its help, usage and options (name, type, default, help), each help section of a command its own table.

    python -m fleetctl.console.cli.reference > docs/cli.md

tests/console/cli/test_cli_reference.py fails when docs/cli.md is not what this prints."""

import re
from collections.abc import Iterator
from enum import Enum
from typing import Any

import typer
from typer.core import TyperArgument, TyperGroup

from fleetctl.console.cli.app import app, click

REGENERATE = "python -m fleetctl.console.cli.reference > docs/cli.md"
HEADER = f"""# fleetctl command reference

<!-- Generated from the typer app by `{REGENERATE}`: edit the commands' help and the settings models'
option declarations, not this file (tests/console/cli/test_cli_reference.py fails when it is stale). -->
"""


def reference() -> str:
    """The Markdown reference of every command of the app."""
    root = typer.main.get_command(app)
    context = click.Context(root, info_name="fleetctl")
    commands = list(walk(root, context))
    index = ["| command | what it does |", "|---|---|"]
    index += [f"| [`{c.command_path}`](#{c.command_path.replace(' ', '-')}) | {cell(first_sentence(c.command.help))} |"
              for c in commands]
    sections = [section(c) for c in commands]
    return "\n".join([HEADER, *paragraphs(root.help), "", *index, "", *sections]).rstrip() + "\n"


def walk(group: click.Command, context: click.Context) -> Iterator[click.Context]:
    """The context of each command under `group`, a group's before its sub-commands', in the help's order."""
    for name in group.list_commands(context):
        command = group.get_command(context, name)
        if command is None or command.hidden:
            continue
        child = click.Context(command, info_name=name, parent=context)
        yield child
        if isinstance(command, TyperGroup):
            yield from walk(command, child)


def section(context: click.Context) -> str:
    command = context.command
    usage = " ".join([context.command_path, *usage_pieces(command)])
    lines = [f"## {context.command_path}", "", *paragraphs(command.help), "", "```", usage, "```", ""]
    for title, params in panels(command):
        if title:
            lines += [f"**{title}**", ""]
        lines += ["| option | type | default | what it does |", "|---|---|---|---|"]
        lines += [f"| {name_cell(p)} | {type_cell(p, context)} | {default_cell(p)} | {cell(p.help or '')} |"
                  for p in params]
        lines.append("")
    return "\n".join(lines)


def usage_pieces(command: click.Command) -> list[str]:
    pieces = ["[OPTIONS]"] if any(not isinstance(p, TyperArgument) for p in command.params) else []
    pieces += [argument_name(p) for p in command.params if isinstance(p, TyperArgument)]
    if isinstance(command, TyperGroup):
        pieces.append("COMMAND")
    return pieces


def panels(command: click.Command) -> list[tuple[str | None, list[click.Parameter]]]:
    """The command's parameters by help section: arguments, the untitled options, then each titled section in the
    order it first appears."""
    shown = [p for p in command.params if not getattr(p, "hidden", False)]
    grouped: dict[str | None, list[click.Parameter]] = {}
    for param in sorted(shown, key=lambda p: not isinstance(p, TyperArgument)):
        grouped.setdefault(getattr(param, "rich_help_panel", None), []).append(param)
    return sorted(grouped.items(), key=lambda item: item[0] is not None)


def argument_name(param: click.Parameter) -> str:
    return param.name.upper() + ("..." if param.nargs == -1 else "")


def name_cell(param: click.Parameter) -> str:
    if isinstance(param, TyperArgument):
        return f"`{argument_name(param)}`"
    names = ", ".join(f"`{opt}`" for opt in param.opts)
    names += "".join(f" / `{opt}`" for opt in param.secondary_opts)
    return names + (f", `${param.envvar}`" if param.envvar else "")


def type_cell(param: Any, context: click.Context) -> str:
    if getattr(param, "is_flag", False):
        return "flag"
    label = param.display_type(context).strip("<>")
    if param.type_descriptor.is_choice:
        return " \\| ".join(f"`{choice}`" for choice in label.split("|"))
    low, high = param.min, param.max
    if low is not None and high is not None:
        return f"{param.bare_type()} in [{low:g}, {high:g}]"
    if low is not None or high is not None:
        return f"{param.bare_type()} {'≥' if low is not None else '≤'} {low if low is not None else high:g}"
    return label


def default_cell(param: Any) -> str:
    value = param.default
    if param.required:
        return "required"
    if getattr(param, "is_flag", False):
        flag = param.opts[0] if value else (param.secondary_opts or [""])[0]
        return f"`{flag}`" if flag and (value or param.secondary_opts) else ""
    if value is None or value == "" or value == [] or callable(value):
        return ""
    return f"`{value.value if isinstance(value, Enum) else value}`"


def paragraphs(text: str | None) -> list[str]:
    """A help text's paragraphs as Markdown ones (typer's rich help joins the lines of each; `\\[` is its `[`)."""
    blocks = (text or "").replace("\\[", "[").split("\n\n")
    return [line for block in blocks if block.strip() for line in (" ".join(block.split()), "")][:-1]


def first_sentence(text: str | None) -> str:
    first = paragraphs(text)[0] if text else ""
    return re.split(r"\.\s+(?=[A-Z])", first)[0].rstrip(".") + "." if first else ""


def cell(text: str) -> str:
    """`text` as one GFM table cell: on one line, its `|` escaped."""
    return " ".join(text.split()).replace("|", "\\|")


if __name__ == "__main__":
    print(reference(), end="")
