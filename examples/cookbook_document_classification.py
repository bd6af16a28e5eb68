"""Cookbook: document classification with confidence. Ask the parent category and the leaf
in one call; an unsure leaf falls back to its parent, an unsure parent to "unclassified".

    .venv/bin/python examples/cookbook_document_classification.py    # or --url http://HOST:PORT
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from typing import Any

Ask = Callable[[dict[str, Any]], dict[str, Any]]

MIN_CONFIDENCE = 0.5
REQUEST = {
    "state": "The filing describes a quarterly dividend distribution to common shareholders.",
    "questions": {
        "category": {"type": "choice",
                     "instructions": "Which category best describes this document?",
                     "criteria": {
                         "finance": "Financial instruments, dividends and accounting",
                         "legal": "Contracts, litigation and compliance",
                         "engineering": "Product design and technical documentation"}},
        "subcategory": {"type": "choice",
                        "instructions": "Which finance subcategory best describes this document?",
                        "criteria": {"finance.dividends": "Dividend distributions",
                                     "finance.reporting": "Accounting and reporting",
                                     "finance.tax": "Tax matters"}},
    },
}


def label(parent: dict[str, Any], leaf: dict[str, Any]) -> str:
    if parent["confidence"] < MIN_CONFIDENCE:
        return "unclassified"
    if leaf["confidence"] < MIN_CONFIDENCE or not leaf["choice"].startswith(parent["choice"]):
        return parent["choice"]  # never commit to a wrong leaf
    return leaf["choice"]


def run(ask: Ask) -> dict[str, Any]:
    answers = ask(REQUEST)["answers"]
    return {"category": answers["category"], "subcategory": answers["subcategory"],
            "label": label(answers["category"], answers["subcategory"])}


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
