"""Pattern: intent routing. One choice question classifies the request; code maps each intent
to a handler and sends low-confidence requests to a person.

    .venv/bin/python examples/cookbook_intent_routing.py      # or --url http://HOST:PORT
"""

from __future__ import annotations

from typing import Any

from shared_cookbook import Ask, main

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


if __name__ == "__main__":
    main(run)
