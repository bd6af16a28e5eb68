"""Cookbook: passage re-ranking. Score each (query, passage) pair on an ordered relevance
scale and sort by the expected level; keep the top passages.

    .venv/bin/python examples/cookbook_reranking.py      # or --url http://HOST:PORT
"""

from __future__ import annotations

from typing import Any

from shared_cookbook import Ask, main

TOP = 2
QUERY = "What is the refund window for damaged items?"
SHORTLIST = [
    "Defective or damaged items are eligible for a full refund within 30 days of delivery.",
    "Our headquarters moved to a new office building in 2021.",
    "Gift cards cannot be exchanged for cash.",
    "Refund requests for damaged goods must include a photo of the damage.",
]
QUESTION = {"type": "score", "instructions": "How relevant is the passage to the query?",
            "criteria": ["Irrelevant", "Weak", "Partial", "Relevant", "Directly answers"]}


def run(ask: Ask) -> dict[str, Any]:
    scored = []
    for passage in SHORTLIST:  # one pair per request: no context rot across candidates
        response = ask({"state": {"query": QUERY, "passage": passage},
                        "questions": {"relevant": QUESTION}})
        answer = response["answers"]["relevant"]
        scored.append({"passage": passage, "score": answer["score"],
                       "confidence": answer["confidence"]})
    ranked = sorted(scored, key=lambda item: item["score"], reverse=True)
    return {"query": QUERY, "ranked": ranked, "top": [r["passage"] for r in ranked[:TOP]]}


if __name__ == "__main__":
    main(run)
