"""Cookbook: document classification with confidence. Ask the parent category and the leaf
in one call; an unsure leaf falls back to its parent, an unsure parent to "unclassified".

    .venv/bin/python examples/cookbook_document_classification.py    # or --url http://HOST:PORT
"""

from __future__ import annotations

from typing import Any

from shared_cookbook import Ask, main

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


if __name__ == "__main__":
    main(run)
