"""Structured outputs in OpenAI's and vLLM's request shapes, as a `specdec.grammar.Grammar`.

Where a constraint may come from (at most one per request):
- `response_format` (chat): {"type": "text"} (none), {"type": "json_object"} (any JSON
  object), {"type": "json_schema", "json_schema": {"name", "schema", "strict"}}. Strict
  and non-strict schemas are both enforced by the grammar: a non-strict schema is not a
  hint here, it is what the output matches;
- `structured_outputs` (vLLM's extension, both APIs): exactly one of "json" (a schema,
  as an object or JSON text), "regex", "choice" (a list of strings) or "grammar" (Lark,
  or GBNF as llama.cpp writes it);
- `guided_json`, `guided_regex`, `guided_choice`, `guided_grammar` (vLLM's older names).

A grammar that cannot be compiled is a 400 naming the parameter it came from, with
llguidance's own explanation (specdec.grammar.check).
"""

from __future__ import annotations

import json

from coordinator.api.openai_errors import bad
from specdec.grammar import Grammar, check

STRUCTURED_FIELDS = {"structured_outputs", "guided_json", "guided_regex", "guided_choice",
                     "guided_grammar"}
_KINDS = {"json": "json_schema", "regex": "regex", "choice": "choice", "grammar": "lark"}


def grammar_of(body: dict) -> Grammar | None:
    """The request's constraint (None: free text); 400 for a malformed or conflicting one."""
    found: list[tuple[str, Grammar]] = []
    fmt = body.get("response_format")
    if fmt is not None:
        g = _response_format(fmt)
        if g is not None:
            found.append(("response_format", g))
    so = body.get("structured_outputs")
    if so is not None:
        if not isinstance(so, dict) or len(set(so) & set(_KINDS)) != 1 \
                or set(so) - set(_KINDS):
            raise bad("`structured_outputs` must be an object with exactly one of "
                      '"json", "regex", "choice", "grammar"', "structured_outputs")
        (key, value), = so.items()
        found.append((f"structured_outputs.{key}", _one(key, value,
                                                         f"structured_outputs.{key}")))
    for key in _KINDS:
        value = body.get(f"guided_{key}")
        if value is not None:
            found.append((f"guided_{key}", _one(key, value, f"guided_{key}")))
    if len(found) > 1:
        raise bad(f"give one constraint, not {' and '.join(p for p, _ in found)}",
                  found[1][0])
    if not found:
        return None
    param, grammar = found[0]
    error = check(grammar)
    if error:
        raise bad(f"`{param}` cannot be used as a grammar: {error}", param)
    return grammar


def _response_format(fmt) -> Grammar | None:
    if not isinstance(fmt, dict) or not isinstance(fmt.get("type"), str):
        raise bad('`response_format` must be an object with a "type": "text", '
                  '"json_object" or "json_schema"', "response_format")
    kind = fmt["type"]
    if kind == "text":
        return None
    if kind == "json_object":
        return Grammar.of("json_object")
    if kind != "json_schema":
        raise bad(f"unknown response_format type {kind!r}; use \"text\", \"json_object\" "
                  "or \"json_schema\"", "response_format")
    spec = fmt.get("json_schema")
    if not isinstance(spec, dict):
        raise bad('response_format {"type": "json_schema"} needs "json_schema": '
                  '{"name": ..., "schema": {...}}', "response_format.json_schema")
    schema = spec.get("schema")
    if not isinstance(schema, dict):
        raise bad('`response_format.json_schema.schema` must be a JSON schema object, got '
                  f"{type(schema).__name__}", "response_format.json_schema.schema")
    return _schema(schema)


def _one(key: str, value, param: str) -> Grammar:
    if key == "json":
        if isinstance(value, str):
            try:
                value = json.loads(value)
            except ValueError as e:
                raise bad(f"`{param}` is not valid JSON: {e}", param) from None
        if not isinstance(value, dict):
            raise bad(f"`{param}` must be a JSON schema object", param)
        return _schema(value)
    if key == "choice":
        if not isinstance(value, list) or not value or \
                not all(isinstance(c, str) and c for c in value):
            raise bad(f"`{param}` must be a non-empty list of non-empty strings", param)
        return Grammar.of("choice", json.dumps(value))
    if not isinstance(value, str) or not value:
        raise bad(f"`{param}` must be a non-empty string", param)
    return Grammar.of(_KINDS[key], value)


def _schema(schema: dict) -> Grammar:
    # (the schema's own key order: the grammar writes the properties in that order)
    return Grammar.of("json_schema", json.dumps(schema))
