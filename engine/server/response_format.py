"""OpenAI's `response_format`: free text, any JSON object, or JSON of a given schema, each as the grammar
(llguidance's) the engine masks the request's tokens with."""

import json
from dataclasses import dataclass
from typing import Annotated, Any, Literal

import llguidance
from pydantic import BaseModel, ConfigDict, Field, model_validator

MAX_SCHEMA_BYTES = 64 * 1024  # a schema's JSON text, at most
# compact JSON, as json.dumps writes it: no run of whitespace a small model could loop on until max_tokens
JSON_LAYOUT: dict[str, Any] = {
    "whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}


@dataclass(frozen=True)
class Constraint:
    """What a request's output is held to: the grammar, and its name in reports (`constraint` on /fleet/requests,
    the kind in /metrics)."""

    grammar: str
    label: str  # json_object, json_schema:NAME, tools:MODE


class SchemaError(ValueError):
    """A JSON schema that cannot be a grammar (pydantic turns it into a 400 naming the field)."""


def json_schema_grammar(schema: dict[str, Any]) -> str:
    """The grammar of JSON text valid under `schema`; SchemaError if it is too large or not an object. Whether
    every keyword is supported is known when the grammar compiles (the engine's Grammars)."""
    text = json.dumps(schema)
    if len(text.encode()) > MAX_SCHEMA_BYTES:
        raise SchemaError(f"the schema is {len(text.encode()):,} bytes of JSON; at most {MAX_SCHEMA_BYTES:,}")
    try:
        return llguidance.LLMatcher.grammar_from_json_schema(text, overrides=JSON_LAYOUT)
    except ValueError as exc:
        raise SchemaError(f"not a usable JSON schema: {exc}") from None


class JsonSchemaFormat(BaseModel):
    model_config = ConfigDict(extra="ignore", populate_by_name=True)

    name: Annotated[str, Field(pattern=r"^[A-Za-z0-9_-]{1,64}$")]
    description: str | None = None
    json_schema: dict[str, Any] = Field(default_factory=dict, alias="schema")
    strict: bool | None = None  # constrained either way: the output always matches the schema


class ResponseFormat(BaseModel):
    model_config = ConfigDict(extra="ignore")

    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None

    @model_validator(mode="after")
    def schema_given_and_usable(self) -> "ResponseFormat":
        if self.type == "json_schema" and self.json_schema is None:
            raise ValueError("response_format of type json_schema needs `json_schema`")
        self.constraint()  # refuses a schema too large or not JSON-schema-shaped now, as a 400
        return self

    def constraint(self) -> Constraint | None:
        if self.type == "json_object":
            return Constraint(json_schema_grammar({"type": "object"}), "json_object")
        if self.type == "json_schema" and self.json_schema is not None:
            return Constraint(json_schema_grammar(self.json_schema.json_schema), f"json_schema:{self.json_schema.name}")
        return None
