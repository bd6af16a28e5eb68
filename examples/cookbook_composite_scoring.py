"""Pattern: composite scoring. One atomic score question per dimension, combined with weights
that live in code: when priorities change, change the coefficients, not the prompts.

    .venv/bin/python examples/cookbook_composite_scoring.py      # or --url http://HOST:PORT
"""

from __future__ import annotations

from typing import Any

from shared_cookbook import Ask, main

WEIGHTS = {"market": 0.5, "feasibility": 0.3, "differentiation": 0.2}
THRESHOLD = 0.5  # of the normalised composite, 0..1
REQUEST = {
    "state": "A pitch for a subscription service for weekly meal planning.",
    "questions": {
        "market": {"type": "score", "instructions": "How large and reachable is the target market?",
                   "criteria": ["Very small", "Small", "Moderate", "Large", "Very large"]},
        "feasibility": {"type": "score", "instructions": "How feasible is the technical build?",
                        "criteria": ["Very hard", "Hard", "Moderate", "Easy", "Trivial"]},
        "differentiation": {"type": "score",
                            "instructions": "How differentiated is this from existing products?",
                            "criteria": ["Commodity", "Weak", "Moderate", "Strong", "Unique"]},
    },
}


def run(ask: Ask) -> dict[str, Any]:
    answers = ask(REQUEST)["answers"]
    # normalise each expected level to 0..1 first, so scales of different lengths combine
    normalised = {name: answers[name]["score"] / (len(REQUEST["questions"][name]["criteria"]) - 1)
                  for name in WEIGHTS}
    composite = sum(WEIGHTS[name] * normalised[name] for name in WEIGHTS)
    least_sure = min(answers[name]["confidence"] for name in WEIGHTS)
    return {"scores": {name: answers[name]["score"] for name in WEIGHTS},
            "normalised": normalised, "composite": composite, "least_confidence": least_sure,
            "decision": "pursue" if composite >= THRESHOLD else "pass"}


if __name__ == "__main__":
    main(run)
