"""What every cookbook script shares: ask the embedded model in-process, or a running server."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from typing import Any

Ask = Callable[[dict[str, Any]], dict[str, Any]]


def asker(argv: list[str]) -> Ask:
    """The embedded model in-process, or ``--url`` for the same body over HTTP."""
    if "--url" in argv:
        import httpx

        url = argv[argv.index("--url") + 1].rstrip("/") + "/v1/systemone"
        return lambda body: httpx.post(url, json=body, timeout=60).raise_for_status().json()
    from onepass import DecisionEngine

    return DecisionEngine.from_pretrained().answer


def main(run: Callable[[Ask], Any]) -> None:
    """Run a cookbook against the model chosen on the command line and print its result."""
    print(json.dumps(run(asker(sys.argv[1:])), indent=2))
