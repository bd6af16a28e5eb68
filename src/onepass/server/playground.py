"""``GET /``: the playground page, one self-contained HTML file shipped in the package.

The page is public (it holds no data); the API calls it makes carry the key the user typed,
kept in the browser's session storage only. Its inline script and style are allowed by hash in
a strict Content-Security-Policy, so the page can talk to this server and nothing else.
"""

from __future__ import annotations

import base64
import hashlib
import re
from importlib import resources

from fastapi import FastAPI
from fastapi.responses import HTMLResponse

from onepass.server.settings import ServerSettings

PAGE = "playground.html"
_INLINE = re.compile(r"<(script|style)>(.*?)</\1>", re.S)


def page_html() -> str:
    """The page as shipped (package data: ``onepass/server/static/playground.html``)."""
    return (resources.files("onepass.server") / "static" / PAGE).read_text(encoding="utf-8")


def content_security_policy(html: str) -> str:
    """Allow exactly the page's own inline blocks (by sha256) and same-origin requests."""
    sources: dict[str, list[str]] = {"script": [], "style": []}
    for kind, body in _INLINE.findall(html):
        digest = base64.b64encode(hashlib.sha256(body.encode()).digest()).decode()
        sources[kind].append(f"'sha256-{digest}'")
    return "; ".join([
        "default-src 'none'",
        f"script-src {' '.join(sources['script']) or chr(39) + 'none' + chr(39)}",
        f"style-src {' '.join(sources['style']) or chr(39) + 'none' + chr(39)}",
        "connect-src 'self'",
        "img-src 'self' data:",
        "base-uri 'none'",
        "form-action 'none'",
        "frame-ancestors 'none'",
    ])


def register(app: FastAPI, settings: ServerSettings) -> None:
    """Serve the page at ``GET /`` unless ``--no-playground`` (``settings.playground``)."""
    if not settings.playground:
        return
    html = page_html()
    headers = {
        "content-security-policy": content_security_policy(html),
        "x-content-type-options": "nosniff",
        "referrer-policy": "no-referrer",
        "cache-control": "no-cache",
    }

    @app.get("/", response_class=HTMLResponse, tags=["Playground"],
             summary="The playground page (no API key needed; its API calls send one)")
    async def playground() -> HTMLResponse:
        return HTMLResponse(html, headers=headers)
