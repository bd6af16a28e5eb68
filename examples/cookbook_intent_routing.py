"""Pattern: intent routing. One choice question classifies the request; code maps each intent
to a handler and sends low-confidence requests to a person.

    .venv/bin/python examples/cookbook_intent_routing.py      # or --url http://HOST:PORT
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from typing import Any

Ask = Callable[[dict[str, Any]], dict[str, Any]]

MIN_CONFIDENCE = 0.5
HANDLERS = {
    "billing": "refund_bot",           # deterministic logic
    "logistics": "carrier_claims",     # a specialist workflow
    "account": "account_service",
    "technical": "support_model",      # a specialist model
}
MESSAGES = [
    "I was charged twice for the same order and need one charge reversed.",
    "My parcel has been stuck at the depot for a week.",
    "The app crashes every time I open the settings page.",
]


def request(message: str) -> dict[str, Any]:
    return {"state": message, "questions": {"intent": {
        "type": "choice",
        "instructions": "Which intent best describes the request?",
        "criteria": {
            "billing": "Double charges, invoices and refunds",
            "logistics": "Damaged, lost or late shipments",
            "account": "Login, profile and cancellation",
            "technical": "Product errors and setup",
        },
    }}}


def route(intent: dict[str, Any]) -> str:
    if intent["confidence"] < MIN_CONFIDENCE:
        return "human_queue"
    return HANDLERS[intent["choice"]]


def run(ask: Ask) -> dict[str, Any]:
    routed = []
    for message in MESSAGES:
        intent = ask(request(message))["answers"]["intent"]
        routed.append({"message": message, "intent": intent["choice"],
                       "confidence": intent["confidence"], "handler": route(intent)})
    return {"routed": routed}


def asker(argv: list[str]) -> Ask:
    """The embedded model in-process, or ``--url`` for the same body over HTTP."""
    if "--url" in argv:
        import httpx

        url = argv[argv.index("--url") + 1].rstrip("/") + "/v1/systemone"
        return lambda body: httpx.post(url, json=body, timeout=60).raise_for_status().json()
    from onepass import DecisionEngine

    return DecisionEngine.from_pretrained().answer


if __name__ == "__main__":
    print(json.dumps(run(asker(sys.argv[1:])), indent=2))
