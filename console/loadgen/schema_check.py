"""Whether a JSON value is valid under a JSON schema, for the schemas `fleetctl bench` itself asks for (its agent
tools' arguments and its ReAct step): `type`, `properties`, `required`, `additionalProperties: false`, `enum`,
`const`, `minLength`/`maxLength`, `minimum`/`maximum`, `items`, `minItems`/`maxItems`, `anyOf`. A keyword it does
not know is a ValueError, so a schema the bench adds later cannot pass unchecked."""

from typing import Any

KNOWN = frozenset({"type", "properties", "required", "additionalProperties", "enum", "const", "minLength", "maxLength",
                   "minimum", "maximum", "items", "minItems", "maxItems", "anyOf", "description", "title"})
_TYPES: dict[str, tuple[type, ...]] = {"object": (dict,), "array": (list,), "string": (str,), "integer": (int,),
                                       "number": (int, float), "boolean": (bool,), "null": (type(None),)}


def _type_problem(value: Any, name: str) -> str | None:
    is_bool = isinstance(value, bool)
    if isinstance(value, _TYPES[name]) and (name == "boolean" or not is_bool):
        return None
    return f"{value!r} is not of type {name}"


def violation(value: Any, schema: dict[str, Any], where: str = "$") -> str | None:
    """The first way `value` breaks `schema`, as "<where>: <what>" (None: valid)."""
    if unknown := set(schema) - KNOWN:
        raise ValueError(f"schema keywords not checked: {sorted(unknown)}")
    if "anyOf" in schema:
        problems = [violation(value, branch, where) for branch in schema["anyOf"]]
        if all(problems):
            return f"{where}: matches no branch of anyOf ({problems[0]})"
    checks = (_type_problem(value, schema["type"]) if "type" in schema else None,
              f"{value!r} is not one of {schema['enum']}" if "enum" in schema and value not in schema["enum"] else None,
              f"{value!r} is not {schema['const']!r}" if "const" in schema and value != schema["const"] else None)
    if problem := next((c for c in checks if c), None):
        return f"{where}: {problem}"
    if isinstance(value, str):
        return _string(value, schema, where)
    if isinstance(value, int | float) and not isinstance(value, bool):
        return _number(value, schema, where)
    if isinstance(value, list):
        return _array(value, schema, where)
    if isinstance(value, dict):
        return _object(value, schema, where)
    return None


def _string(value: str, schema: dict[str, Any], where: str) -> str | None:
    if len(value) < schema.get("minLength", 0):
        return f"{where}: shorter than {schema['minLength']} characters"
    if "maxLength" in schema and len(value) > schema["maxLength"]:
        return f"{where}: longer than {schema['maxLength']} characters"
    return None


def _number(value: float, schema: dict[str, Any], where: str) -> str | None:
    if "minimum" in schema and value < schema["minimum"]:
        return f"{where}: {value} is below the minimum {schema['minimum']}"
    if "maximum" in schema and value > schema["maximum"]:
        return f"{where}: {value} is above the maximum {schema['maximum']}"
    return None


def _array(value: list, schema: dict[str, Any], where: str) -> str | None:
    if len(value) < schema.get("minItems", 0):
        return f"{where}: fewer than {schema['minItems']} items"
    if "maxItems" in schema and len(value) > schema["maxItems"]:
        return f"{where}: more than {schema['maxItems']} items"
    items = schema.get("items", {})
    return next((p for i, item in enumerate(value) if (p := violation(item, items, f"{where}[{i}]"))), None)


def _object(value: dict, schema: dict[str, Any], where: str) -> str | None:
    if missing := [name for name in schema.get("required", []) if name not in value]:
        return f"{where}: {missing[0]!r} is required"
    properties = schema.get("properties", {})
    if schema.get("additionalProperties") is False and (extra := [k for k in value if k not in properties]):
        return f"{where}: {extra[0]!r} is not allowed"
    return next((p for key, item in value.items() if key in properties
                 and (p := violation(item, properties[key], f"{where}.{key}"))), None)
