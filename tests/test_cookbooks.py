"""Every pattern and cookbook of the docs is a script in ``examples/``; each runs here against
the real embedded model, and its decision is checked against the answers it was made from."""

from __future__ import annotations

import importlib.util
import math
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
SCRIPTS = sorted(p.stem for p in EXAMPLES.glob("cookbook_*.py"))
sys.path.insert(0, str(EXAMPLES))  # the scripts import shared_cookbook, as they do when run


def load(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, EXAMPLES / f"{name}.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def recording(engine) -> tuple[list[dict[str, Any]], Any]:
    """``engine.answer``, keeping every request the script sent."""
    sent: list[dict[str, Any]] = []

    def ask(body: dict[str, Any]) -> dict[str, Any]:
        sent.append(body)
        return engine.answer(body)

    return sent, ask


def check_distribution(probabilities: dict[str, float]) -> None:
    assert probabilities and math.isclose(sum(probabilities.values()), 1.0, abs_tol=1e-5)


def test_every_documented_recipe_has_a_script():
    documented = sorted(f"cookbook_{n}" for n in (
        "confidence_gated", "composite_scoring", "intent_routing", "speculative_fanout",
        "customer_support", "moderation", "reranking", "document_classification"))
    assert documented == SCRIPTS


def test_confidence_gated(engine):
    module = load("cookbook_confidence_gated")
    sent, ask = recording(engine)
    out = module.run(ask)
    assert len(sent) == 1
    check_distribution(out["probabilities"])
    assert out["intent"] == max(out["probabilities"], key=out["probabilities"].get)
    c = out["confidence"]
    assert out["action"] == ("automatic" if c >= 0.85 else "human_review" if c >= 0.45
                             else "escalate")
    assert [module.gate(x) for x in (0.9, 0.5, 0.1)] == ["automatic", "human_review", "escalate"]


def test_composite_scoring(engine):
    module = load("cookbook_composite_scoring")
    out = module.run(engine.answer)
    assert set(out["scores"]) == {"market", "feasibility", "differentiation"}
    expected = 0.5 * out["scores"]["market"] / 4 + 0.3 * out["scores"]["feasibility"] / 4 \
        + 0.2 * out["scores"]["differentiation"] / 4
    assert out["composite"] == pytest.approx(expected)
    assert 0 <= out["composite"] <= 1
    assert out["decision"] == ("pursue" if out["composite"] >= 0.5 else "pass")


def test_intent_routing(engine):
    module = load("cookbook_intent_routing")
    out = module.run(engine.answer)
    assert [r["message"] for r in out["routed"]] == module.MESSAGES
    for r in out["routed"]:
        want = "human_queue" if r["confidence"] < 0.5 else module.HANDLERS[r["intent"]]
        assert r["handler"] == want


def test_speculative_fanout_is_one_request(engine):
    module = load("cookbook_speculative_fanout")
    sent, ask = recording(engine)
    out = module.run(ask)
    assert len(sent) == 1 and out["asked"] == list(module.REQUEST["questions"])
    assert out["usage"]["output_tokens"] == 4  # four decision positions, one forward pass
    answers = out["answers"]
    assert out["plan"]["department"] == answers["department"]["choice"]
    assert out["plan"]["refund"] is (answers["refund_eligible"]["noul"] >= 0.5)
    assert ("manager_note" in out["plan"]) is out["plan"]["refund"]


def test_customer_support(engine):
    module = load("cookbook_customer_support")
    out = module.run(engine.answer)
    a = out["answers"]
    dept = a["responsible_department"]
    check_distribution(dept["probabilities"])
    if dept["confidence"] < 0.5:
        assert out["action"] == f"queue_for_human(suggested={dept['choice']})"
    elif a["refund_eligible"]["noul"] >= 0.8 and a["urgency"]["score"] >= 1.5:
        assert out["action"] == f"open_priority_case({dept['choice']})"
    else:
        assert out["action"] == f"route({dept['choice']})"


def test_moderation(engine):
    module = load("cookbook_moderation")
    out = module.run(engine.answer)
    assert len(out["screened"]) == 2
    for s in out["screened"]:
        want = ("block" if s["hazard"] >= 0.9 and s["category_confidence"] >= 0.7
                else "review" if s["hazard"] >= 0.5 else "allow")
        assert s["verdict"] == want and 0 <= s["severity"] <= 4


def test_reranking(engine):
    module = load("cookbook_reranking")
    sent, ask = recording(engine)
    out = module.run(ask)
    assert len(sent) == len(module.SHORTLIST)
    scores = [r["score"] for r in out["ranked"]]
    assert scores == sorted(scores, reverse=True)
    assert sorted(r["passage"] for r in out["ranked"]) == sorted(module.SHORTLIST)
    assert out["top"] == [r["passage"] for r in out["ranked"][:2]]


def test_document_classification(engine):
    module = load("cookbook_document_classification")
    out = module.run(engine.answer)
    parent, leaf = out["category"], out["subcategory"]
    if parent["confidence"] < 0.5:
        assert out["label"] == "unclassified"
    elif leaf["confidence"] < 0.5 or not leaf["choice"].startswith(parent["choice"]):
        assert out["label"] == parent["choice"]
    else:
        assert out["label"] == leaf["choice"]
    sure = {"choice": "finance", "confidence": 0.9}
    assert module.label(sure, {"choice": "finance.tax", "confidence": 0.2}) == "finance"
    assert module.label(sure, {"choice": "finance.tax", "confidence": 0.8}) == "finance.tax"
    assert module.label({"choice": "legal", "confidence": 0.1}, sure) == "unclassified"
