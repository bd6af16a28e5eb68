"""Operations routes: ``GET /health`` (readiness), ``GET /health/live`` (liveness) and
``GET /metrics`` (Prometheus). No API key: a load balancer and a scraper call them.

Module-level handlers registered by :func:`register`; they read the runtime on ``app.state``.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import Response

from onepass.server.context import StrictJSONResponse
from onepass.server.errors import retry_headers


async def health(request: Request) -> Response:
    rt = request.app.state.runtime
    if rt.draining:
        return StrictJSONResponse({"status": "draining"}, status_code=503)
    if rt.engine is not None:
        down = await asyncio.to_thread(unhealthy_engines, rt.engines)  # HTTP: off the loop
        if down:  # a remote engine behind a model is down: not ready for traffic
            return StrictJSONResponse({"status": "engine_unavailable", "engines": down},
                                      status_code=503, headers=retry_headers(2.0))
        return StrictJSONResponse({
            "status": "ok", "startup_seconds": rt.startup_seconds,
            "model": rt.engine.served_name,
            "queue_depth": rt.queue.depth, "in_flight": rt.in_flight,
        })
    if rt.load_error:
        return StrictJSONResponse({"status": "failed", "error": rt.load_error},
                                  status_code=503)
    return StrictJSONResponse(
        {"status": "loading", "seconds": round(time.monotonic() - rt.created, 1)},
        status_code=503, headers=retry_headers(2.0),
    )


async def live() -> Response:
    return StrictJSONResponse({"status": "ok"})


async def metrics(request: Request) -> Response:
    body, content_type = request.app.state.runtime.metrics.render()
    return Response(body, media_type=content_type)


def unhealthy_engines(engines: dict[str, Any]) -> dict[str, str]:
    """Served name -> why, for each model whose backend reports an unhealthy remote engine."""
    down = {}
    for name, engine in engines.items():
        check = getattr(getattr(engine, "backend", None), "health", None)
        if check is not None:
            ok, detail = check()
            if not ok:
                down[name] = detail
    return down


def register(app: FastAPI) -> None:
    app.get("/health", tags=["Operations"],
            summary="Readiness: 200 once the model is loaded")(health)
    app.get("/health/live", tags=["Operations"],
            summary="Liveness: independent of the model")(live)
    app.get("/metrics", tags=["Operations"], summary="Prometheus metrics")(metrics)
