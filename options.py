"""Each option declared once, on the settings model it configures: its flags, help, bounds and the conversion from
what is typed to the field's value ride on the field's annotation; its default is the field's.

    @dataclass(frozen=True)
    class EngineSettings:
        max_num_seqs: Annotated[int, CliOption("--max-num-seqs", min=1, help="Sequences per worker batch.")] = 64

A field holding another settings model is `Nested` (its options are the model's), one built from several options is
`Combined`, one computed from other fields when built from a command line is `Derived`. The command line's options
(`console/cli/declared.py`) and docs/cli.md are derived from these declarations, and `build` makes a model from a
command line's values. Works for dataclasses and pydantic models alike (both keep `Annotated` metadata); imports
nothing of fleetctl, so every layer declares its options with it."""

from collections.abc import Callable, Iterator, Mapping
from dataclasses import MISSING, dataclass, fields, is_dataclass
from types import NoneType, UnionType
from typing import Annotated, Any, Union, get_args, get_origin, get_type_hints


@dataclass(frozen=True)
class Conversion:
    """How a value typed on the command line (`cli_type`) becomes the field's (`to_field`), and the field's
    default the command line's (`to_cli`)."""

    cli_type: Any
    to_field: Callable[[Any], Any]
    to_cli: Callable[[Any], Any]


MIB = Conversion(int, lambda mib: mib * 2**20, lambda size: size // 2**20)  # typed in MiB, kept in bytes
MIB_OR_NONE = Conversion(int, lambda mib: mib * 2**20 or None, lambda size: (size or 0) // 2**20)  # 0: unset
GB = Conversion(float, lambda gb: int(gb * 1e9), lambda size: size / 1e9)  # typed in GB, kept in bytes
ZERO_IS_NONE = Conversion(int, lambda number: number or None, lambda number: number or 0)
EMPTY_IS_NONE = Conversion(str, lambda text: text or None, lambda text: text or "")
COMMA_LIST = Conversion(str, lambda text: tuple(part.strip() for part in text.split(",") if part.strip()), ",".join)
REPEATED = Conversion(list[str], tuple, list)  # an option given once per value


@dataclass(frozen=True, init=False)
class CliOption:
    """One command-line option. Its type is the field's (or its conversion's `cli_type`; `type` for an option that
    is not a field's own, one of a `Combined`'s), its default the field's (`default` where the command line's
    differs: a name the command resolves, or None for "as the settings file says")."""

    flags: tuple[str, ...]
    help: str
    min: float | None
    max: float | None
    choices: tuple[Any, ...]  # the values allowed, for a type that does not list them itself (an Enum does)
    convert: Conversion | None
    type: Any
    default: Any
    envvar: str | None
    metavar: str | None
    panel: str | None  # the help's section, where it is not its model's

    def __init__(self, *flags: str, help: str, min: float | None = None, max: float | None = None,
                 choices: tuple[Any, ...] = (), convert: Conversion | None = None, type: Any = None,
                 default: Any = MISSING, envvar: str | None = None, metavar: str | None = None,
                 panel: str | None = None) -> None:
        values = dict(flags=flags, help=help, min=min, max=max, choices=choices, convert=convert, type=type,
                      default=default, envvar=envvar, metavar=metavar, panel=panel)
        for name, value in values.items():
            object.__setattr__(self, name, value)

    @property
    def name(self) -> str:
        """Its value's key in a command line's values: the first long flag, `--kv-memory` -> `kv_memory`."""
        long = next(flag for flag in self.flags if flag.startswith("--"))
        return long.split("/")[0].removeprefix("--").replace("-", "_")

    def out_of_bounds(self, value: Any) -> bool:
        """Whether `value` is outside [min, max] or not one of the choices."""
        return ((self.min is not None and value < self.min) or (self.max is not None and value > self.max)
                or (bool(self.choices) and value not in self.choices))


@dataclass(frozen=True)
class Nested:
    """A field holding another settings model: its options are the model's. With a `gate` (a flag) the field is
    None unless the flag is given."""

    panel: str | None = None
    gate: CliOption | None = None


@dataclass(frozen=True, init=False)
class Combined:
    """A field built from several options: `build(*their values)`."""

    options: tuple[CliOption, ...]
    build: Callable[..., Any]

    def __init__(self, *options: CliOption, build: Callable[..., Any]) -> None:
        object.__setattr__(self, "options", options)
        object.__setattr__(self, "build", build)


@dataclass(frozen=True, init=False)
class Derived:
    """A field with no option of its own, computed from other fields (`inputs`) when a command line sets them."""

    inputs: tuple[str, ...]
    compute: Callable[..., Any]

    def __init__(self, *inputs: str, compute: Callable[..., Any]) -> None:
        object.__setattr__(self, "inputs", inputs)
        object.__setattr__(self, "compute", compute)


Marker = CliOption | Nested | Combined | Derived


@dataclass(frozen=True)
class Declared:
    """One declared field of a settings model."""

    field: str
    type: Any  # the field's type, without its declaration
    default: Any  # MISSING for a field without one
    marker: Marker


@dataclass(frozen=True)
class Placed:
    """One option as a command shows it: its type and default on the command line, and its help section."""

    option: CliOption
    type: Any
    default: Any
    panel: str | None


def declarations(model: type) -> list[Declared]:
    """The declared fields of `model` (a dataclass or a pydantic model), in their order."""
    if is_dataclass(model):
        hints = get_type_hints(model, include_extras=True)
        found = [(f.name, hints[f.name], _dataclass_default(f)) for f in fields(model)]
        return [Declared(name, get_args(hint)[0], default, marker) for name, hint, default in found
                if get_origin(hint) is Annotated for marker in get_args(hint)[1:] if isinstance(marker, Marker)]
    return [Declared(name, info.annotation, info.get_default(call_default_factory=True), marker)
            for name, info in model.model_fields.items() for marker in info.metadata if isinstance(marker, Marker)]


def _dataclass_default(f: Any) -> Any:
    return f.default_factory() if f.default_factory is not MISSING else f.default


def settings_model(annotation: Any) -> type:
    """The model a `Nested` field holds (`AutoplanSettings | None` holds AutoplanSettings)."""
    if get_origin(annotation) in (Union, UnionType):
        return next(arg for arg in get_args(annotation) if arg is not NoneType)
    return annotation


def placed(model: type, panel: str | None = None) -> Iterator[Placed]:
    """Every option of `model` and of the models it nests, with its command-line type and default."""
    for declared in declarations(model):
        marker = declared.marker
        if isinstance(marker, CliOption):
            convert = marker.convert
            default = (marker.default if marker.default is not MISSING
                       else convert.to_cli(declared.default) if convert else declared.default)
            cli_type = convert.cli_type if convert else marker.type or declared.type
            yield Placed(marker, cli_type, default, marker.panel or panel)
        elif isinstance(marker, Combined):
            yield from (Placed(option, option.type, option.default, option.panel or panel) for option in marker.options)
        elif isinstance(marker, Nested):
            inner = marker.panel or panel
            if marker.gate is not None:
                yield Placed(marker.gate, bool, False, marker.gate.panel or inner)
            yield from placed(settings_model(declared.type), inner)


def field_values(model: type, values: Mapping[str, Any]) -> dict[str, Any]:
    """The fields of `model` that a command line's `values` (keyed by option name) set, converted."""
    found: dict[str, Any] = {}
    for declared in declarations(model):
        marker = declared.marker
        if isinstance(marker, CliOption) and marker.name in values:
            value = values[marker.name]
            found[declared.field] = marker.convert.to_field(value) if marker.convert else value
        elif isinstance(marker, Combined) and all(option.name in values for option in marker.options):
            found[declared.field] = marker.build(*(values[option.name] for option in marker.options))
        elif isinstance(marker, Nested) and marker.gate is None:
            found[declared.field] = build(settings_model(declared.type), values)
        elif isinstance(marker, Nested) and marker.gate.name in values:
            found[declared.field] = build(settings_model(declared.type), values) if values[marker.gate.name] else None
    for declared in declarations(model):
        marker = declared.marker
        if isinstance(marker, Derived) and all(name in found for name in marker.inputs):
            found[declared.field] = marker.compute(*(found[name] for name in marker.inputs))
    return found


def build(model: type, values: Mapping[str, Any], **given: Any) -> Any:
    """`model` from a command line's `values`; `given` sets fields the command resolved itself (a model's
    directory from its name)."""
    return model(**(field_values(model, values) | given))
