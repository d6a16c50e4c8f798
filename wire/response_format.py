"""Structured outputs: `response_format` and vLLM's `guided_*` fields, parsed and checked.

One request carries at most one of
- `response_format`: `{"type": "text"}` (no constraint), `{"type": "json_object"}` (any
  JSON object) or `{"type": "json_schema", "json_schema": {"name", "schema", "strict"}}`;
- vLLM's extensions `guided_json` (a schema), `guided_choice` (a list of strings),
  `guided_regex`, `guided_grammar` (llguidance's Lark, or GBNF, which is converted).

Each becomes a `StructuredOutput`: the grammar in llguidance's format, which the replica
compiles against its tokenizer (runtime/engine/structured_output.py) and enforces token by token.
The check here is the grammar engine's own, run without a tokenizer, so the control plane
refuses a malformed schema or one using a keyword the engine does not implement (a 400
naming it) with the replica's rules, before any replica thaws. llguidance is imported on
the first request that carries a format (see docs/structured-outputs.md for why llguidance).
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Optional

from wire.errors import ProtocolError
from wire.json_input import parse_json

FIELDS = frozenset({"response_format", "guided_json", "guided_choice", "guided_regex", "guided_grammar"})
ANY_OBJECT: dict[str, Any] = {"type": "object"}
# JSON as json.dumps writes it (what models have read most), with no free whitespace: a
# model cannot pad the output with spaces forever, and the output stays compact.
JSON_LAYOUT = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}


@dataclass(frozen=True)
class StructuredOutput:
    """What the output must match. `grammar` is llguidance's grammar text; `field` names
    the request field it came from (for error messages). Frozen and hashable: the
    replica caches compiled grammars by it."""
    field: str
    grammar: str


def parse_structured_output(body: dict[str, Any]) -> Optional[StructuredOutput]:
    """The request's format, checked by the grammar engine; None when it has none."""
    given = sorted(name for name in FIELDS if body.get(name) is not None)
    if len(given) > 1:
        raise ProtocolError(f"{given[1]}: only one of {given[0]} and {given[1]} may be given",
                            param=given[1])
    if not given:
        return None
    name = given[0]
    grammar = _grammar(name, body[name])
    if grammar is None:
        return None
    check_grammar(name, grammar)
    return StructuredOutput(field=name, grammar=grammar)


def json_schema_output(schema: dict[str, Any], field: str = "response_format") -> StructuredOutput:
    """A schema from elsewhere (a tool's parameters), checked like response_format's."""
    check_json_schema(field, schema)
    grammar = _llguidance().LLMatcher.grammar_from_json_schema(schema, defaults=JSON_LAYOUT)
    check_grammar(field, grammar)
    return StructuredOutput(field=field, grammar=grammar)


def _grammar(name: str, value: Any) -> Optional[str]:
    matcher = _llguidance().LLMatcher
    if name == "response_format":
        return _response_format(value)
    if name == "guided_json":
        schema = _schema_value(name, value)
        check_json_schema(name, schema)
        return str(matcher.grammar_from_json_schema(schema, defaults=JSON_LAYOUT))
    if name == "guided_choice":
        return _choice_grammar(value)
    if not isinstance(value, str) or not value:
        raise ProtocolError(f"{name}: must be a non-empty string", param=name)
    if name == "guided_regex":
        return str(matcher.grammar_from_regex(value))
    return str(matcher.grammar_from_lark(_as_lark(value)))


def _response_format(value: Any) -> Optional[str]:
    name = "response_format"
    if not isinstance(value, dict):
        raise ProtocolError(f"{name}: must be an object", param=name)
    kind = value.get("type")
    if kind == "text":
        return None
    if kind == "json_object":
        return str(_llguidance().LLMatcher.grammar_from_json_schema(ANY_OBJECT, defaults=JSON_LAYOUT))
    if kind != "json_schema":
        raise ProtocolError(f"{name}.type: must be one of text, json_object, json_schema", param=name)
    spec = value.get("json_schema")
    if not isinstance(spec, dict):
        raise ProtocolError(f"{name}.json_schema: must be an object", param=name)
    if spec.get("name") is not None and not isinstance(spec.get("name"), str):
        raise ProtocolError(f"{name}.json_schema.name: must be a string", param=name)
    schema = _schema_value(f"{name}.json_schema.schema", spec.get("schema", ANY_OBJECT))
    check_json_schema(f"{name}.json_schema.schema", schema)
    return str(_llguidance().LLMatcher.grammar_from_json_schema(schema, defaults=JSON_LAYOUT))


def _schema_value(where: str, value: Any) -> dict[str, Any]:
    if isinstance(value, str):   # vLLM accepts the schema as JSON text too
        value = parse_json(value, where, param=where.split(".")[0])
    if not isinstance(value, dict):
        raise ProtocolError(f"{where}: must be a JSON schema object", param=where.split(".")[0])
    return value


def check_json_schema(where: str, schema: dict[str, Any]) -> None:
    """A malformed schema (by its own meta-schema) is refused with the validator's words."""
    import jsonschema

    try:
        jsonschema.validators.validator_for(schema).check_schema(schema)
    except jsonschema.SchemaError as exc:
        path = "".join(f"[{json.dumps(p)}]" for p in exc.absolute_path)
        raise ProtocolError(f"{where}{path}: invalid JSON schema: {exc.message}",
                            param=where.split(".")[0]) from None


def _choice_grammar(value: Any) -> str:
    if not (isinstance(value, list) and value and all(isinstance(c, str) and c for c in value)):
        raise ProtocolError("guided_choice: must be a non-empty list of non-empty strings",
                            param="guided_choice")
    # Lark string literals take JSON's escapes, so each choice is matched byte for byte.
    return str(_llguidance().LLMatcher.grammar_from_lark(
        "start: " + " | ".join(json.dumps(c, ensure_ascii=False) for c in value)))


def _as_lark(grammar: str) -> str:
    """GBNF (llama.cpp's, `root ::= ...`) is converted; anything else is read as Lark."""
    if "::=" not in grammar:
        return grammar
    from llguidance.gbnf_to_lark import gbnf_to_lark

    try:
        return str(gbnf_to_lark(grammar))
    except Exception as exc:   # noqa: BLE001 - the converter raises plain exceptions
        raise ProtocolError(f"guided_grammar: invalid GBNF grammar: {exc}", param="guided_grammar") from None


def check_grammar(where: str, grammar: str) -> None:
    """The grammar engine's verdict, without a tokenizer: errors and unimplemented keywords."""
    is_error, messages = _llguidance().LLMatcher.validate_grammar_with_warnings(grammar)
    if is_error or messages:   # a warning is a keyword it would ignore: refuse, don't drift
        detail = " ".join(messages[0].split())[:300] if messages else "invalid"
        raise ProtocolError(f"{where}: not supported: {detail}", param=where.split(".")[0])


def _llguidance() -> Any:
    import llguidance

    return llguidance
