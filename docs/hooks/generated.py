"""MkDocs hook: the reference pages that are generated from the code at build time.

- ``http-reference.md`` from the app's own OpenAPI document (``create_app(loader).openapi()``:
  the app is built around a loader that is never called, so no model is needed), plus the
  routes the framework serves outside that document;
- ``cli-reference.md`` from each command's own ``--help``.

Generated in memory (``File.generated``), so nothing under ``docs/`` is written.
"""

from __future__ import annotations

import json
import os
from typing import Any

from mkdocs.structure.files import File, Files

METHODS = ("get", "post", "put", "patch", "delete")


def _no_model() -> Any:
    raise RuntimeError("the docs build never loads a model")


def app_routes() -> tuple[dict[str, Any], list[tuple[str, str]]]:
    """The OpenAPI document and every (METHOD, path) the app answers, documented or not."""
    from onepass.server.app import create_app

    app = create_app(_no_model)
    routes = []
    for route in app.routes:
        for method in sorted(getattr(route, "methods", None) or ()):
            if method != "HEAD":
                routes.append((method, route.path))
    return app.openapi(), sorted(set(routes), key=lambda r: (r[1], r[0]))


def _schema_name(ref: str) -> str:
    return ref.rsplit("/", 1)[-1]


def _anchor(name: str) -> str:
    return "schema-" + name.lower()


def http_reference() -> str:
    doc, routes = app_routes()
    paths = doc.get("paths", {})
    lines = [
        "# HTTP API reference",
        "",
        f"Generated from the server's OpenAPI document ({doc['info']['title']} "
        f"{doc['info']['version']}, the same one `GET /openapi.json` serves) when this site "
        "was built. Errors always use the envelope "
        '`{"error": {"message", "type", "field", "request_id"}}`.',
        "",
    ]
    documented = set()
    by_tag: dict[str, list[tuple[str, str, dict[str, Any]]]] = {}
    for path, item in paths.items():
        for method in METHODS:
            if method in item:
                op = item[method]
                by_tag.setdefault((op.get("tags") or ["Other"])[0], []).append(
                    (method.upper(), path, op))
                documented.add((method.upper(), path))
    for tag, ops in by_tag.items():
        lines += [f"## {tag}", ""]
        for method, path, op in ops:
            lines += [f"### `{method} {path}`", ""]
            if op.get("summary"):
                lines += [f"**{op['summary']}.**", ""]
            if op.get("description"):
                lines += [op["description"].strip(), ""]
            params = op.get("parameters") or []
            if params:
                lines += ["| parameter | in | required | description |", "|---|---|---|---|"]
                for p in params:
                    desc = (p.get("description") or "").replace("|", "\\|").replace("\n", " ")
                    lines.append(f"| `{p['name']}` | {p['in']} | {p.get('required', False)} "
                                 f"| {desc} |")
                lines.append("")
            body = op.get("requestBody", {}).get("content", {})
            for media, spec in body.items():
                ref = spec.get("schema", {}).get("$ref")
                target = f"[`{_schema_name(ref)}`](#{_anchor(_schema_name(ref))})" if ref else \
                    "JSON"
                lines += [f"Request body ({media}): {target}", ""]
            lines += ["| status | description |", "|---|---|"]
            for status, resp in op.get("responses", {}).items():
                desc = (resp.get("description") or "").replace("|", "\\|").replace("\n", " ")
                ref = next((c.get("schema", {}).get("$ref") for c in
                            resp.get("content", {}).values() if c.get("schema", {}).get("$ref")),
                           None)
                if ref:
                    desc += f" → [`{_schema_name(ref)}`](#{_anchor(_schema_name(ref))})"
                lines.append(f"| {status} | {desc} |")
            lines.append("")
    others = [r for r in routes if r not in documented]
    lines += ["## Outside the OpenAPI document", "",
              "Served by the framework itself (the document and its viewers):", ""]
    for method, path in others:
        lines += [f"### `{method} {path}`", ""]
    lines += ["## Schemas", ""]
    for name, schema in sorted(doc.get("components", {}).get("schemas", {}).items()):
        lines += [f'### {name} {{#{_anchor(name)}}}', "", "```json",
                  json.dumps(schema, indent=2), "```", ""]
    return "\n".join(lines)


def cli_reference() -> str:
    from onepass.cli import COMMANDS, build_parser

    os.environ["COLUMNS"] = "100"  # argparse wraps help text to the terminal width
    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "command")
    lines = ["# CLI reference", "",
             "Each section is the command's own `--help`, captured when this site was built.",
             "Every flag also reads `ONEPASS_<FLAG>` from the environment (flag > environment "
             "> default).", "", "## `onepass`", "", "```text", parser.format_help().strip(),
             "```", ""]
    for name in COMMANDS:
        lines += [f"## `onepass {name}`", "", "```text",
                  sub.choices[name].format_help().strip(), "```", ""]
    return "\n".join(lines)


def on_files(files: Files, config: Any) -> Files:
    files.append(File.generated(config, "http-reference.md", content=http_reference()))
    files.append(File.generated(config, "cli-reference.md", content=cli_reference()))
    return files
