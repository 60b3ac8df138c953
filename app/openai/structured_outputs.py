"""vLLM's `structured_outputs` request field: one constraint on what the engine may generate (a JSON schema,
any JSON object, a regular expression, one of given strings, or a grammar), checked as vLLM checks it and bounded
as this service bounds every per-request artefact the engine compiles (docs/api.md)."""

from __future__ import annotations

import json
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from app.errors import LONE_SURROGATE, InvalidRequest
from app.openai.sampling_bounds import text_only

MAX_JSON_SCHEMA_NESTING = 64  # the same limit as vLLM's (MAX_STRUCTURED_OUTPUT_JSON_NESTING)
# Bounds vLLM does not set: the engine compiles each into an automaton per request.
MAX_REGEX_CHARS = 4_096
MAX_GRAMMAR_CHARS = 65_536
MAX_CHOICES = 256
MAX_CHOICE_CHARS = 1_024
MAX_SCHEMA_CHARS = 65_536
_KINDS = ("json", "regex", "choice", "grammar", "json_object")


def checked_schema(schema: dict[str, Any] | None) -> dict[str, Any] | None:
    """The schema, refused (ValueError) when nested deeper than vLLM allows or holding a string that is not text."""
    # vLLM refuses deeper schemas anyway; refused here, a deep one never reaches the Ray handle,
    # whose pickling of it fails ("excessively deep recursion", a 500). Level by level, no recursion.
    level: list[Any] = [schema] if schema else []
    for _ in range(MAX_JSON_SCHEMA_NESTING):
        level = [
            child
            for node in level
            for child in (node.values() if isinstance(node, dict) else node)
            if isinstance(child, (dict, list))
        ]
        if not level:
            break
    else:
        raise ValueError(
            f"the schema is nested too deeply: objects and arrays may nest at most {MAX_JSON_SCHEMA_NESTING} levels"
        )
    try:  # xgrammar's JSON parser refuses a lone surrogate (legal JSON: "\\ud800") in its own words
        json.dumps(schema, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError(f"the schema holds {LONE_SURROGATE}") from None
    return schema


class StructuredOutputs(BaseModel):
    """Exactly one of the constraints (vLLM's `StructuredOutputsParams`; its other options are not taken)."""

    model_config = ConfigDict(extra="forbid")
    json_: dict[str, Any] | str | None = Field(None, alias="json")
    regex: str | None = Field(None, min_length=1, max_length=MAX_REGEX_CHARS)
    choice: list[str] | None = Field(None, min_length=1, max_length=MAX_CHOICES)
    grammar: str | None = Field(None, min_length=1, max_length=MAX_GRAMMAR_CHARS)
    json_object: bool | None = None

    @field_validator("json_", mode="after")
    @classmethod
    def _a_schema(cls, value: dict[str, Any] | str | None) -> dict[str, Any] | None:
        if isinstance(value, str):  # vLLM takes the schema as JSON text too
            if len(value) > MAX_SCHEMA_CHARS:
                raise ValueError(f"the schema is over {MAX_SCHEMA_CHARS} characters")
            try:
                value = json.loads(value)
            except json.JSONDecodeError as err:
                raise ValueError(f"the schema is not valid JSON: {err}") from None
            if not isinstance(value, dict):
                raise ValueError("the schema must be a JSON object")
        if value is not None and len(json.dumps(value)) > MAX_SCHEMA_CHARS:
            raise ValueError(f"the schema is over {MAX_SCHEMA_CHARS} characters as JSON")
        return checked_schema(value)

    @field_validator("choice")
    @classmethod
    def _bounded_choices(cls, value: list[str] | None) -> list[str] | None:
        if value is not None and any(len(c) > MAX_CHOICE_CHARS for c in value):
            raise ValueError(f"a choice is over {MAX_CHOICE_CHARS} characters")
        # A lone surrogate in a choice broke the grammar gate's cache key: a 500.
        text_only("structured_outputs", value or (), named="structured_outputs.choice")
        return value

    @model_validator(mode="after")
    def _exactly_one(self) -> StructuredOutputs:
        given = [k for k in _KINDS if getattr(self, "json_" if k == "json" else k) not in (None, False)]
        if len(given) != 1:
            raise InvalidRequest(  # vLLM's messages
                "You can only use one kind of structured outputs constraint but multiple are specified: "
                f"{given}" if given else "You must use one kind of structured outputs constraint but none are "
                "specified",
                param="structured_outputs",
            )
        return self

    def params(self) -> dict[str, Any]:
        """The constraint as `GenerationParams` fields."""
        return {
            "json_schema": self.json_,
            "json_object": bool(self.json_object),
            "json_schema_param": "structured_outputs",
            "regex": self.regex,
            "choice": tuple(self.choice) if self.choice is not None else None,
            "grammar": self.grammar,
        }


class JsonSchemaSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str = Field(..., min_length=1, max_length=64)
    schema_: dict[str, Any] | None = Field(None, alias="schema")
    strict: bool | None = None
    description: str | None = None

    @field_validator("schema_")
    @classmethod
    def _checked_schema(cls, schema: dict[str, Any] | None) -> dict[str, Any] | None:
        return checked_schema(schema)


class ResponseFormat(BaseModel):
    model_config = ConfigDict(extra="forbid")
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaSpec | None = None

    @model_validator(mode="after")
    def _schema_present(self) -> ResponseFormat:
        if self.type == "json_schema" and self.json_schema is None:
            raise ValueError("type 'json_schema' needs a 'json_schema' object")
        return self


def response_format_params(fmt: ResponseFormat | None, structured: StructuredOutputs | None) -> dict[str, Any]:
    """`GenerationParams` fields for OpenAI's `response_format` on chat and completions, by vLLM's rule: it takes the
    place of `structured_outputs`' JSON constraint, and with a regex, choice or grammar there two kinds are refused;
    none for `text`."""
    if fmt is None or fmt.type == "text":
        return {}
    if structured is not None and (structured.regex is not None or structured.choice is not None
                                   or structured.grammar is not None):
        raise InvalidRequest("You can only use one kind of structured outputs constraint; 'response_format' and "
                             "'structured_outputs' ask for two", param="structured_outputs")
    return {
        "json_object": fmt.type == "json_object",
        "json_schema": (fmt.json_schema.schema_ or {}) if fmt.type == "json_schema" and fmt.json_schema else None,
        "json_schema_param": "response_format",
        "regex": None, "choice": None, "grammar": None,
    }
