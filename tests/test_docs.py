"""The documentation site builds with ``mkdocs build --strict`` and its generated references
match the code: every route the app serves is in the HTTP reference (and nothing else), every
command's ``--help`` is in the CLI reference, every cookbook script is shown in the docs."""

from __future__ import annotations

import html
import re
import subprocess
import sys
from pathlib import Path

# the site's only build in CI (.ci/run leaves it to this module): a dev dependency, so its
# absence fails here instead of skipping
import mkdocs  # noqa: F401
import pytest

ROOT = Path(__file__).resolve().parent.parent
ROUTE = re.compile(r"<h3 id=\"[^\"]*\"><code>([A-Z]+) (/[^<]*)</code>")


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("site")
    run = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
        env={"NO_MKDOCS_2_WARNING": "1", "PATH": "/usr/bin:/bin", "COLUMNS": "100",
             "HOME": str(out)},
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    return out


def app_routes() -> set[tuple[str, str]]:
    from onepass.server.app import create_app

    app = create_app(lambda: None)
    return {(method, route.path) for route in app.routes
            for method in (getattr(route, "methods", None) or ()) if method != "HEAD"}


def test_http_reference_lists_exactly_the_routes_of_the_app(site):
    page = (site / "http-reference" / "index.html").read_text()
    listed = [(m, html.unescape(p)) for m, p in ROUTE.findall(page)]
    assert len(listed) == len(set(listed)), "a route is listed twice"
    routes = app_routes()
    assert set(listed) == routes
    # the ones this project documents everywhere, so an empty app cannot pass
    assert {("POST", "/v1/systemone"), ("POST", "/v1/decisions"),
            ("POST", "/v1/decisions/schema"), ("GET", "/v1/models"),
            ("GET", "/"), ("GET", "/health"), ("GET", "/metrics"),
            ("GET", "/openapi.json")} <= routes
    assert 'id="schema-systemonerequestmodel"' in page  # request bodies link to their schema


def test_cli_reference_is_each_commands_help(site):
    from onepass.cli import COMMANDS

    page = html.unescape((site / "cli-reference" / "index.html").read_text())
    for name in COMMANDS:
        assert f"usage: onepass {name}" in page, name
    assert "--no-playground" in page  # a flag added to serve shows up without editing docs


def test_every_cookbook_script_is_shown_and_python_reference_rendered(site):
    text = html.unescape((site / "patterns" / "index.html").read_text()
                         + (site / "cookbooks" / "index.html").read_text())
    for script in sorted((ROOT / "examples").glob("cookbook_*.py")):
        first = script.read_text().split("\n")[0].strip('"')  # the docstring's first line
        assert first in text, script.name
        assert script.name in text
    python = (site / "python-reference" / "index.html").read_text()
    for name in ("onepass.engine.DecisionEngine", "onepass.contract.ContractError",
                 "onepass.server.app.create_app"):
        assert name in python
    assert (site / "img" / "playground.png").stat().st_size > 10_000
