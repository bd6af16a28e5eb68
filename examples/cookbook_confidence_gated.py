"""Pattern: confidence-gated routing. The answer says *what*, its confidence says *whether* to
act: above HIGH act automatically, between LOW and HIGH ask a human, below LOW escalate.

    .venv/bin/python examples/cookbook_confidence_gated.py                 # embedded model
    .venv/bin/python examples/cookbook_confidence_gated.py --url http://127.0.0.1:8080
"""

from __future__ import annotations

from typing import Any

from shared_cookbook import Ask, main

HIGH, LOW = 0.85, 0.45  # calibrate on a held-out set, per question
REQUEST = {
    "state": "The user asks whether the annual plan can be cancelled mid-cycle.",
    "questions": {
        "intent": {
            "type": "choice",
            "instructions": "Which intent best describes the user request?",
            "criteria": {
                "billing": "Payments, invoices and refunds",
                "account": "Login, profile and cancellation",
                "technical": "Product errors and setup",
            },
        },
    },
}


def gate(confidence: float) -> str:
    """The three bands; the thresholds are yours, not the model's."""
    if confidence >= HIGH:
        return "automatic"
    if confidence >= LOW:
        return "human_review"
    return "escalate"


def run(ask: Ask) -> dict[str, Any]:
    answer = ask(REQUEST)["answers"]["intent"]
    return {"intent": answer["choice"], "confidence": answer["confidence"],
            "probabilities": answer["probabilities"], "action": gate(answer["confidence"])}


if __name__ == "__main__":
    main(run)
