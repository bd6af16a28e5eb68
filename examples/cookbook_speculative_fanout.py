"""Pattern: speculative fan-out. Ask every question that might matter in ONE request (they
share one prefill and one forward pass) and let code pick the answers this case needs.

    .venv/bin/python examples/cookbook_speculative_fanout.py      # or --url http://HOST:PORT
"""

from __future__ import annotations

from typing import Any

from shared_cookbook import Ask, main

REQUEST = {
    "state": "The customer reports a defective medical device that a dependant uses daily.",
    "questions": {
        "refund_eligible": {"type": "noul", "instructions":
                            "The customer is eligible for a full refund under the store policy."},
        "urgent": {"type": "score", "instructions": "How urgent is this case?",
                   "criteria": ["Routine", "Urgent", "Emergency"]},
        "department": {"type": "choice",
                       "instructions": "Which department should handle this case?",
                       "criteria": {"billing": "Payments", "logistics": "Shipments",
                                    "product_support": "Defective-item support"}},
        "requires_manager": {"type": "noul",
                             "instructions": "This refund requires a manager approval note."},
    },
}


def run(ask: Ask) -> dict[str, Any]:
    response = ask(REQUEST)
    answers = response["answers"]
    plan = {"department": answers["department"]["choice"]}
    # code decides relevance: the manager question only matters when a refund is likely
    if answers["refund_eligible"]["noul"] >= 0.5:
        plan["refund"] = True
        plan["manager_note"] = answers["requires_manager"]["noul"] >= 0.5
    else:
        plan["refund"] = False
    plan["priority"] = "high" if answers["urgent"]["score"] >= 1.0 else "normal"
    return {"asked": list(answers), "usage": response["usage"], "plan": plan,
            "answers": answers}


if __name__ == "__main__":
    main(run)
