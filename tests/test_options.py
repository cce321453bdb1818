"""The option declarations (`fleetctl/options.py`): a model's options are found on its fields' annotations (a
dataclass's or a pydantic model's), with the command line's type and default; a command line's values become the
model through the declared conversions, a combined option, a derived field and a gated nested model; bounds say
what they refuse."""

from dataclasses import dataclass, field
from typing import Annotated

import pytest
from pydantic import BaseModel

from fleetctl.options import (
    COMMA_LIST,
    EMPTY_IS_NONE,
    GB,
    MIB,
    MIB_OR_NONE,
    REPEATED,
    ZERO_IS_NONE,
    CliOption,
    Combined,
    Derived,
    Nested,
    build,
    declarations,
    placed,
)


@dataclass(frozen=True)
class Inner:
    depth: Annotated[int, CliOption("--depth", min=1, max=9, help="How deep.")] = 3


@dataclass(frozen=True)
class Outer:
    name: Annotated[str, CliOption("--name", "-n", type=str, default="x", help="Resolved by the command.")]
    memory_bytes: Annotated[int | None, CliOption("--memory", convert=MIB_OR_NONE, help="MiB.")] = None
    hosts: Annotated[tuple[str, ...], CliOption("--hosts", convert=COMMA_LIST, help="a,b")] = ()
    timeout_s: Annotated[float, CliOption("--timeout", help="Seconds.")] = 8.0
    beat_s: Annotated[float, Derived("timeout_s", compute=lambda timeout: timeout / 4)] = 1.0
    pair: Annotated[tuple[str, ...], Combined(
        CliOption("--left", type=str | None, default=None, help="L"),
        CliOption("--right", type=str | None, default=None, help="R"),
        build=lambda left, right: tuple(side for side in (left, right) if side))] = ()
    inner: Annotated[Inner, Nested(panel="Inner")] = field(default_factory=Inner)
    extra: Annotated[Inner | None, Nested(gate=CliOption("--extra", help="Also an extra."))] = None
    plain: int = 0  # no option: never set from a command line


class Pydantic(BaseModel):
    interval: Annotated[float, CliOption("--interval", min=0.2, help="Seconds.")] = 1.0
    keys: dict[str, str] = {}


def defaults(model: type) -> dict[str, object]:
    """A command line given nothing: every option at its default."""
    return {p.option.name: p.default for p in placed(model)}


def test_options_are_found_in_order_with_their_command_line_types_and_defaults() -> None:
    assert [p.option.name for p in placed(Outer)] == ["name", "memory", "hosts", "timeout", "left", "right", "depth",
                                                      "extra", "depth"]
    shown = {p.option.name: (p.type, p.default, p.panel) for p in placed(Outer, "Outer")}
    assert shown["depth"] == (int, 3, "Outer")  # the gated model's, under its gate's panel
    assert [p.panel for p in placed(Outer, "Outer") if p.option.name == "depth"] == ["Inner", "Outer"]
    assert shown["memory"] == (int, 0, "Outer")  # MiB, 0 for unset
    assert shown["hosts"] == (str, "", "Outer")
    assert shown["name"] == (str, "x", "Outer")
    assert shown["extra"] == (bool, False, "Outer")
    assert [d.field for d in declarations(Pydantic)] == ["interval"]


def test_nothing_given_builds_the_model_s_defaults() -> None:
    assert build(Outer, defaults(Outer), name="x") == Outer(name="x", beat_s=2.0)  # the derived field follows
    assert build(Pydantic, {"interval": 1.0}) == Pydantic()


def test_a_command_line_s_values_become_the_model() -> None:
    values = defaults(Outer) | {"memory": 512, "hosts": " a, b,,", "timeout": 2.0, "right": "r", "depth": 7,
                                "extra": True}
    built = build(Outer, values, name="resolved")
    assert built == Outer(name="resolved", memory_bytes=512 * 2**20, hosts=("a", "b"), timeout_s=2.0, beat_s=0.5,
                          pair=("r",), inner=Inner(7), extra=Inner(7))


def test_a_field_whose_options_a_command_leaves_out_keeps_its_default() -> None:
    built = build(Outer, {"timeout": 4.0}, name="x")
    assert (built.beat_s, built.pair, built.extra, built.inner) == (1.0, (), None, Inner())
    assert build(Outer, {}, name="x").beat_s == 1.0  # the derived field's input was not given


@pytest.mark.parametrize(("conversion", "typed", "kept"), [
    (MIB, 3, 3 * 2**20),
    (MIB_OR_NONE, 0, None),
    (GB, 1.5, 1_500_000_000),
    (ZERO_IS_NONE, 0, None),
    (ZERO_IS_NONE, 4, 4),
    (EMPTY_IS_NONE, "", None),
    (COMMA_LIST, "cpu:0, cpu:1", ("cpu:0", "cpu:1")),
    (REPEATED, ["a", "b"], ("a", "b")),
])
def test_conversions_round_trip(conversion, typed, kept) -> None:
    assert conversion.to_field(typed) == kept
    assert conversion.to_field(conversion.to_cli(kept)) == kept


def test_bounds_and_choices_say_what_they_refuse() -> None:
    depth = CliOption("--depth", min=1, max=9, help="")
    assert [depth.out_of_bounds(v) for v in (0, 1, 9, 10)] == [True, False, False, True]
    sizes = CliOption("--size", choices=(32, 64), help="")
    assert [sizes.out_of_bounds(v) for v in (32, 48)] == [False, True]
    assert CliOption("--no-bounds", help="").out_of_bounds(-(10**9)) is False


def test_an_option_s_name_is_its_first_long_flag() -> None:
    assert CliOption("-m", "--model", help="").name == "model"
    assert CliOption("--prefix-cache/--no-prefix-cache", help="").name == "prefix_cache"
