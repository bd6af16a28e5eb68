"""Structured logs: one JSON object per line, so request lines can be grepped and parsed.

A record's ``fields`` (passed as ``extra={"fields": {...}}``) become top-level keys; the access
log writes one such line per request (id, route, model, questions, tokens, cache, queue and
compute time, status).
"""

from __future__ import annotations

import json
import logging
import sys
import time
from typing import Any


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        fields = getattr(record, "fields", None)
        if isinstance(fields, dict):
            out.update(fields)
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        return json.dumps(out, ensure_ascii=False, default=str)


def configure(level: str = "info") -> None:
    """JSON lines on stderr for onepass and uvicorn (uvicorn's own access log is replaced)."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    for name in ("uvicorn", "uvicorn.error"):
        lg = logging.getLogger(name)
        lg.handlers[:] = []
        lg.propagate = True
    logging.getLogger("uvicorn.access").disabled = True
    # Libraries that are chatty at info (weight loading progress, HTTP client).
    for name in ("httpx", "httpcore", "transformers", "filelock"):
        logging.getLogger(name).setLevel(max(logging.WARNING, root.level))
