"""Cookbook: customer-support routing. Refund eligibility (noul), the owning department
(choice) and urgency (score) for one ticket, in one call, then the code that acts on them.

    .venv/bin/python examples/cookbook_customer_support.py      # or --url http://HOST:PORT
"""

from __future__ import annotations

from typing import Any

from shared_cookbook import Ask, main

REQUEST = {
    "state": "Order #7710 arrived with a smashed box and a cracked vase inside. Delivery was "
             "3 days ago and the customer asks what to do next.",
    "questions": {
        "refund_eligible": {"type": "noul", "instructions":
                            "The customer is eligible for a full refund under the store policy."},
        "responsible_department": {
            "type": "choice",
            "instructions": "Which department should handle this case?",
            "criteria": {
                "billing": "Double charges and payment errors",
                "logistics": "Damaged, lost, or late shipments",
                "product_support": "Defective-item troubleshooting, replacements, and setup help",
            },
        },
        "urgency": {"type": "score", "instructions": "How urgent is this case?",
                    "criteria": ["Routine", "Urgent", "Emergency"]},
    },
}


def act(answers: dict[str, Any]) -> str:
    refund = answers["refund_eligible"]["noul"] >= 0.8
    department = answers["responsible_department"]
    if department["confidence"] < 0.5:
        return f"queue_for_human(suggested={department['choice']})"
    if refund and answers["urgency"]["score"] >= 1.5:
        return f"open_priority_case({department['choice']})"
    return f"route({department['choice']})"


def run(ask: Ask) -> dict[str, Any]:
    answers = ask(REQUEST)["answers"]
    return {"answers": answers, "action": act(answers)}


if __name__ == "__main__":
    main(run)
