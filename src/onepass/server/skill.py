"""``GET /.skill``: a Markdown document an LLM agent can read to call every route correctly.

Rendered at request time from the app's own OpenAPI document (routes, summaries, auth, request
schemas with ``$ref`` resolved, status tables, examples) and the running server's settings and
models (the limits in force), so it cannot drift from what the server does: a field added to a
request model shows up here without touching this module. Public (it holds no data), like
``/openapi.json``.
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import Response

from onepass.server.errors import STATUS_BY_KIND
from onepass.server.settings import ServerSettings

PATH = "/.skill"
METHODS = ("get", "post", "put", "patch", "delete")
_REF = "#/components/schemas/"


class MarkdownResponse(Response):
    media_type = "text/markdown"


@dataclass(frozen=True)
class Limit:
    """One limit in force: its setting's name, its value and what happens past it."""

    name: str
    value: Any
    effect: str


def server_limits(settings: ServerSettings) -> list[Limit]:
    """The HTTP layer's limits, straight from the settings the server runs with."""
    return [
        Limit("max_body_bytes", settings.max_body_bytes,
              "request body bytes, counted again after Content-Encoding decoding: 413 above"),
        Limit("max_questions", settings.max_questions,
              "questions per POST /v1/systemone or POST /v1/decisions, schema fields per "
              "POST /v1/decisions/schema: 413 above"),
        Limit("max_queue", settings.max_queue,
              "decision requests waiting per model: 429 with retry-after-ms when full"),
        Limit("request_deadline", settings.request_deadline,
              "seconds a decision request may wait for its turn: 429 after (retry later)"),
        Limit("workers", settings.workers, "decision requests prepared at once per model"),
        Limit("header_timeout", settings.header_timeout,
              "seconds to send the request line and headers: the connection is closed after"),
        Limit("max_connections", settings.max_connections,
              "open connections: past it the oldest one idle before its request is closed"),
    ]


def model_limits(runtime: Any) -> list[dict[str, Any]]:
    """Per served model: its input and output token limits and its generation slots; empty
    while the models load."""
    rows = []
    for name, engine in (getattr(runtime, "engines", None) or {}).items():
        gen = getattr(engine, "generator", None)
        scheduler = getattr(gen, "scheduler", None)
        rows.append({
            "model": name,
            "max_input_tokens": getattr(engine, "max_input_tokens", None),
            "context_tokens": getattr(gen, "context_length", None),
            "default_max_output_tokens": getattr(gen, "default_max_output_tokens", None),
            "generation_slots": getattr(scheduler, "max_sequences", None),
            "generation_waiting_line": getattr(scheduler, "max_waiting", None),
        })
    return rows


_MODEL_COLUMNS = {
    "model": "model (send as `model`)",
    "max_input_tokens": "max input tokens (413 above; never truncated)",
    "context_tokens": "context tokens (prompt + output)",
    "default_max_output_tokens": "output tokens when no limit is sent",
    "generation_slots": "sequences generated at once",
    "generation_waiting_line": "generations waiting (429 when full)",
}


def register(app: FastAPI, settings: ServerSettings) -> None:
    """Serve the document at ``GET /.skill`` (no API key: it holds no data)."""

    @app.get(PATH, response_class=MarkdownResponse, tags=["Operations"],
             summary="How to call every route (request fields, limits, errors, examples): "
             "Markdown for an LLM agent; no API key needed",
             responses={200: {"content": {"text/markdown": {"schema": {"type": "string"}}},
                              "description": "The document"}})
    async def skill(request: Request) -> MarkdownResponse:
        runtime = getattr(request.app.state, "runtime", None)
        # the configured address, never the request's Host header (which the client writes:
        # an injected host would put another server in the examples an agent runs)
        text = render(app.openapi(), server_limits(settings), model_limits(runtime),
                      base_url=settings.base_url, configured=True)
        return MarkdownResponse(text)


# --------------------------------------------------------------------------- rendering


def render(doc: Mapping[str, Any], limits: Sequence[Limit],
           models: Sequence[Mapping[str, Any]] = (), base_url: str = "http://127.0.0.1:8080",
           configured: bool = False) -> str:
    """The whole document from an OpenAPI document and the limits in force (pure)."""
    info = doc.get("info", {})
    ops = [(method.upper(), path, item[method]) for path, item in doc.get("paths", {}).items()
           for method in METHODS if method in item and path != PATH]
    secured = any(op.get("security") for _, _, op in ops)
    lines = [
        f"# {info.get('title', 'API')} {info.get('version', '')}: how to call this server",
        "",
        _cell(info.get("summary") or info.get("description") or "", table=False),
        "",
        f"Base URL: `{base_url}` (no `/v1` suffix: the paths below include it)"
        + (": the server's configured address (`--public-url`, else `--host`/`--port`), not "
           "the Host header of this request; if you reached this page at another address, "
           "use that one" if configured else "")
        + ". Bodies are "
        "JSON objects in UTF-8 (`content-type: application/json`); duplicate keys, NaN and "
        "Infinity are refused. The same contract as OpenAPI: `GET /openapi.json`. Every "
        "response carries `x-typesafe-request-id`.",
        "",
        "## Authentication",
        "",
    ]
    if secured:
        lines.append("Routes marked *auth: Bearer* need the header `Authorization: Bearer "
                     "<key>` (missing: 403, wrong: 401); the others need nothing.")
    else:
        lines.append("This server runs without an API key: no route needs one.")
    lines += ["", "## Limits in force", "", "| setting | value | what it bounds |",
              "|---|---|---|"]
    lines += [f"| `{lim.name}` | {lim.value} | {_cell(lim.effect)} |" for lim in limits]
    lines += ["", "### Models", ""]
    if models:
        columns = [c for c in _MODEL_COLUMNS if any(m.get(c) is not None for m in models)]
        lines += ["| " + " | ".join(_MODEL_COLUMNS[c] for c in columns) + " |",
                  "|" + "---|" * len(columns)]
        for m in models:
            lines.append("| " + " | ".join(
                f"`{m[c]}`" if c == "model" else str(m.get(c, "")) for c in columns) + " |")
        lines += ["", "A request without `model` gets the first one."]
    else:
        lines.append("The models are still loading (`GET /health` says when); fetch this "
                     "document again to see their token limits.")
    lines += ["", *_errors_section(doc, ops), "## Routes", ""]
    for method, path, op in ops:
        lines += _route(doc, method, path, op, base_url)
    return "\n".join(lines).rstrip() + "\n"


def _errors_section(doc: Mapping[str, Any], ops: Sequence[tuple[str, str, Any]]) -> list[str]:
    """The error envelopes (every schema an error status refers to) and the type table."""
    envelopes: list[str] = []
    for _, _, op in ops:
        for status, resp in op.get("responses", {}).items():
            ref = _response_ref(resp)
            if str(status)[:1] in "45" and ref and ref not in envelopes:
                envelopes.append(ref)
    lines = ["## Errors", "",
             'Every error is a JSON envelope `{"error": {"message", "type", "field", '
             '"request_id"}}`: `message` names the field and what was expected, `field` the '
             "field at fault. 429 and 503 carry `retry-after-ms` and `retry-after`: wait, then "
             "send the same request again. Never retry another 4xx unchanged.", ""]
    for name in envelopes:
        lines += _object_tables(doc, [name])
    lines += ["| error.type | status |", "|---|---|"]
    lines += [f"| `{kind}` | {status} |" for kind, status in
              sorted(STATUS_BY_KIND.items(), key=lambda kv: (kv[1], kv[0]))]
    return [*lines, ""]


def _route(doc: Mapping[str, Any], method: str, path: str, op: Mapping[str, Any],
           base_url: str) -> list[str]:
    lines = [f"### `{method} {path}`", ""]
    if op.get("summary"):
        lines += [_cell(op["summary"], table=False) + ".", ""]
    if op.get("description"):
        lines += [_cell(op["description"], table=False), ""]
    lines += [f"- Auth: {'Bearer' if op.get('security') else 'none'}", ""]
    params = op.get("parameters") or []
    if params:
        lines += ["| parameter | in | type / range | required | description |",
                  "|---|---|---|---|---|"]
        for p in params:
            lines.append(f"| `{p['name']}` | {p['in']} | {_type(doc, p.get('schema', {}), [])} "
                         f"| {'yes' if p.get('required') else 'no'} "
                         f"| {_cell(p.get('description', ''))} |")
        lines.append("")
    body_ref = _body_ref(op)
    if body_ref:
        lines += [f"Request body (JSON): `{body_ref}`", ""]
        lines += _object_tables(doc, [body_ref], heading=False)
    lines += ["| status | meaning |", "|---|---|"]
    for status, resp in op.get("responses", {}).items():
        meaning = _cell(resp.get("description", ""))
        ref = _response_ref(resp)
        if ref:
            meaning += f" (`{ref}`)"
        lines.append(f"| {status} | {meaning} |")
    lines += ["", "Example:", "", "```sh", _curl(doc, method, path, op, base_url), "```", ""]
    return lines


# --------------------------------------------------------------------------- schemas


def _resolve(doc: Mapping[str, Any], schema: Mapping[str, Any]) -> Mapping[str, Any]:
    ref = schema.get("$ref")
    if not ref:
        return schema
    return doc.get("components", {}).get("schemas", {}).get(ref[len(_REF):], {})


def _body_ref(op: Mapping[str, Any]) -> str | None:
    schema = (op.get("requestBody", {}).get("content", {}).get("application/json", {})
              .get("schema", {}))
    ref = schema.get("$ref")
    return ref[len(_REF):] if ref else None


def _response_ref(resp: Mapping[str, Any]) -> str | None:
    for media in resp.get("content", {}).values():
        ref = media.get("schema", {}).get("$ref")
        if ref:
            return ref[len(_REF):]
    return None


def _object_tables(doc: Mapping[str, Any], names: list[str], heading: bool = True
                   ) -> list[str]:
    """A field table for each named object schema, then for every object its fields refer
    to (breadth first, each once)."""
    lines: list[str] = []
    done: set[str] = set()
    queue = list(names)
    first = True
    while queue:
        name = queue.pop(0)
        if name in done:
            continue
        done.add(name)
        schema = _resolve(doc, {"$ref": _REF + name})
        props = schema.get("properties")
        if props is None:
            continue
        if heading or not first:
            lines += [f"`{name}`:", ""]
        first = False
        if schema.get("description"):
            lines += [_cell(schema["description"], table=False), ""]
        required = set(schema.get("required", ()))
        lines += ["| field | type / range | required | default | description |",
                  "|---|---|---|---|---|"]
        for field, spec in props.items():
            default = json.dumps(spec["default"]) if "default" in spec else ""
            lines.append(f"| `{field}` | {_type(doc, spec, queue)} "
                         f"| {'yes' if field in required else 'no'} | {_cell(default)} "
                         f"| {_cell(spec.get('description', ''))} |")
        if schema.get("additionalProperties") is False:
            lines += ["", "No other field is accepted."]
        lines.append("")
    return lines


def _type(doc: Mapping[str, Any], schema: Mapping[str, Any], queue: list[str]) -> str:
    """A schema as a short phrase with its ranges (``number in [0, 2]``); objects a field
    refers to are appended to ``queue`` for their own table."""
    if "$ref" in schema:
        name = schema["$ref"][len(_REF):]
        target = _resolve(doc, schema)
        if not target:
            return "any JSON"
        if "properties" not in target:
            return _type(doc, target, queue)
        queue.append(name)
        return f"`{name}`"
    for key in ("anyOf", "oneOf"):
        if key in schema:
            parts = [_type(doc, s, queue) for s in schema[key] if s.get("type") != "null"]
            return " or ".join(dict.fromkeys(parts)) or "null"
    if "const" in schema:
        return f"`{json.dumps(schema['const'])}`"
    if "enum" in schema:
        return "one of " + ", ".join(f"`{json.dumps(v)}`" for v in schema["enum"])
    kind = schema.get("type")
    if kind == "array":
        items = _type(doc, schema.get("items", {}), queue)
        return f"array{_count(schema, 'Items', 'items')} of {items}"
    if kind == "object":
        text = "object" + _count(schema, "Properties", "keys")
        if "propertyNames" in schema:
            text += f" with keys {_type(doc, {'type': 'string', **schema['propertyNames']}, queue)}"
        if "properties" in schema:
            text += " {" + ", ".join(schema["properties"]) + "}"
        extra = schema.get("additionalProperties")
        if isinstance(extra, dict):
            text += f" of {_type(doc, extra, queue)}"
        for pattern, value in schema.get("patternProperties", {}).items():
            text += f" with keys matching `{pattern}` of {_type(doc, value, queue)}"
        return text
    if kind == "string":
        text = "string" + _count(schema, "Length", "characters")
        if "pattern" in schema:
            text += f" matching `{schema['pattern']}`"
        return text
    if kind in ("integer", "number"):
        return kind + _range(schema)
    return kind or "any JSON"


def _count(schema: Mapping[str, Any], suffix: str, unit: str) -> str:
    low, high = schema.get(f"min{suffix}"), schema.get(f"max{suffix}")
    if low is not None and high is not None:
        return f" ({low} {unit})" if low == high else f" ({low} to {high} {unit})"
    if low is not None:
        return f" (at least {low} {unit})"
    if high is not None:
        return f" (at most {high} {unit})"
    return ""


def _range(schema: Mapping[str, Any]) -> str:
    low, high = schema.get("minimum"), schema.get("maximum")
    low_x, high_x = schema.get("exclusiveMinimum"), schema.get("exclusiveMaximum")
    if low_x is not None:
        low = low_x
    if high_x is not None:
        high = high_x
    if low is not None and high is not None:
        return (f" in {'(' if low_x is not None else '['}{_num(low)}, {_num(high)}"
                f"{')' if high_x is not None else ']'}")
    if low is not None:
        return f" {'>' if low_x is not None else '>='} {_num(low)}"
    if high is not None:
        return f" {'<' if high_x is not None else '<='} {_num(high)}"
    return ""


def _num(value: float) -> str:
    return str(value) if isinstance(value, int) else f"{value:g}"


# --------------------------------------------------------------------------- examples


def example_body(doc: Mapping[str, Any], op: Mapping[str, Any]) -> Any:
    """The request body shown for ``op``: the document's own example, else the body schema's
    first example, else one built from its required fields; None without a body."""
    media = op.get("requestBody", {}).get("content", {}).get("application/json")
    if media is None:
        return None
    if "example" in media:
        return media["example"]
    return _example(doc, media.get("schema", {}), 0)


def _example(doc: Mapping[str, Any], schema: Mapping[str, Any], depth: int) -> Any:
    schema = _resolve(doc, schema)
    for key in ("examples", "enum"):
        if schema.get(key):
            return schema[key][0]
    if "const" in schema:
        return schema["const"]
    if "default" in schema and schema["default"] is not None:
        return schema["default"]
    if depth > 8:
        return None
    for key in ("anyOf", "oneOf"):
        branches = [s for s in schema.get(key, ()) if s.get("type") != "null"]
        if branches:
            return _example(doc, branches[0], depth + 1)
    kind = schema.get("type")
    if kind == "object" or "properties" in schema:
        props = schema.get("properties", {})
        out = {k: _example(doc, props[k], depth + 1) for k in schema.get("required", ())
               if k in props}
        extra = schema.get("additionalProperties")
        if not out and isinstance(extra, dict):
            out = {"key": _example(doc, extra, depth + 1)}
        return out
    if kind == "array":
        return [_example(doc, schema.get("items", {}), depth + 1)
                for _ in range(max(1, schema.get("minItems", 1)))]
    if kind in ("integer", "number"):
        low = schema.get("minimum", schema.get("exclusiveMinimum", 0))
        value = max(low, 1) if schema.get("maximum", 1) >= 1 else low
        return int(value) if kind == "integer" else float(value)
    if kind == "boolean":
        return False
    return "text"


def _curl(doc: Mapping[str, Any], method: str, path: str, op: Mapping[str, Any],
          base_url: str) -> str:
    for p in op.get("parameters") or ():
        if p.get("in") == "path":
            path = path.replace("{" + p["name"] + "}", p["name"].upper())
    parts = ["curl", "-sS"] + ([] if method == "GET" else ["-X", method]) + [base_url + path]
    if op.get("security"):
        parts += ["-H", '"Authorization: Bearer $ONEPASS_API_KEY"']
    body = example_body(doc, op)
    if body is not None:
        parts += ["-H", "'content-type: application/json'",
                  "-d", shlex.quote(json.dumps(body, ensure_ascii=False))]
    return " ".join(parts)


def _cell(text: str, table: bool = True) -> str:
    """One line of Markdown; in a table, ``|`` escaped."""
    flat = " ".join(str(text).split())
    return flat.replace("|", "\\|") if table else flat
