"""The bench's own JSON-schema check: a valid value passes, and each kind of departure is named with its place."""

import pytest

from fleetctl.console.loadgen.agent_tools import REACT_STEP, TOOL_PARAMETERS
from fleetctl.console.loadgen.schema_check import violation

SEARCH = TOOL_PARAMETERS["search"]
VALID = {"query": "kv cache", "max_results": 5, "sources": ["web", "code"]}


def test_valid_values_pass() -> None:
    assert violation(VALID, SEARCH) is None
    assert violation({"query": "q", "max_results": 1}, SEARCH) is None  # `sources` is not required
    assert violation({"thought": "look it up", "action": "search", "input": "x"}, REACT_STEP) is None
    assert violation(3, {"anyOf": [{"type": "string"}, {"type": "integer"}]}) is None


@pytest.mark.parametrize(("value", "problem"), [
    ("not an object", "$: 'not an object' is not of type object"),
    ({"max_results": 5}, "$: 'query' is required"),
    (VALID | {"page": 2}, "$: 'page' is not allowed"),
    (VALID | {"query": ""}, "$.query: shorter than 1 characters"),
    (VALID | {"query": "x" * 65}, "$.query: longer than 64 characters"),
    (VALID | {"max_results": 2.5}, "$.max_results: 2.5 is not of type integer"),
    (VALID | {"max_results": True}, "$.max_results: True is not of type integer"),
    (VALID | {"max_results": 0}, "$.max_results: 0 is below the minimum 1"),
    (VALID | {"max_results": 21}, "$.max_results: 21 is above the maximum 20"),
    (VALID | {"sources": []}, "$.sources: fewer than 1 items"),
    (VALID | {"sources": ["web"] * 4}, "$.sources: more than 3 items"),
    (VALID | {"sources": ["web", "mail"]}, "$.sources[1]: 'mail' is not one of ['web', 'docs', 'code']"),
])
def test_each_kind_of_departure_is_named(value: object, problem: str) -> None:
    assert violation(value, SEARCH) == problem


def test_enum_const_any_of_and_unknown_keywords() -> None:
    assert violation({"thought": "t", "action": "fly", "input": "i"}, REACT_STEP) == (
        "$.action: 'fly' is not one of ['search', 'read', 'run', 'write']")
    assert violation("b", {"const": "a"}) == "$: 'b' is not 'a'"
    assert violation([], {"anyOf": [{"type": "string"}, {"type": "integer"}]}).startswith(
        "$: matches no branch of anyOf")
    with pytest.raises(ValueError, match="pattern"):
        violation("a", {"type": "string", "pattern": "^a$"})  # a keyword it cannot check is never passed over
