"""The trained quantity is the served one: the loss is -log of the restricted softmax the
engine reads, at the same tokens, for every question type."""

from __future__ import annotations

import math

import pytest
import torch
from train_support import single_thread

from onepass import prompt as P
from onepass.readout import restricted_softmax
from onepass.train.dataset import parse_record
from onepass.train.loop import collate, encode_records
from onepass.train.loss import Batch, decision_logits, restricted_cross_entropy

one_thread = pytest.fixture(scope="module", autouse=True)(single_thread)

RECORD = {
    "state": "I was charged twice for my order #1142 and the support line keeps hanging up.",
    "questions": {
        "refund": {"type": "noul", "instructions": "The customer asks for money back.",
                   "answer": "yes"},
        "dept": {"type": "choice", "instructions": "Which team should handle it?",
                 "criteria": {"billing": "payments and invoices", "logistics": "shipping",
                              "support": None}, "answer": "billing"},
        "urgency": {"type": "score", "instructions": "How urgent is it?",
                    "criteria": ["low", "medium", "high"], "answer": "high"},
        "approved": {"type": "noul", "instructions": "A refund is approved.",
                     "criteria": {"yes": "Approved", "no": "Rejected"}, "answer": "Rejected"},
    },
}


def test_restricted_cross_entropy_matches_readout_math():
    logits = torch.tensor([[2.0, -1.0, 0.5, float("-inf")], [0.1, 0.2, float("-inf"),
                                                              float("-inf")]])
    targets = torch.tensor([2, 0])
    losses = restricted_cross_entropy(logits, targets, "none")
    expected = [
        -math.log(restricted_softmax([2.0, -1.0, 0.5])[2]),
        -math.log(restricted_softmax([0.1, 0.2])[0]),
    ]
    assert losses.tolist() == pytest.approx(expected, abs=1e-6)
    assert restricted_cross_entropy(logits, targets).item() == pytest.approx(sum(expected) / 2)


def test_collate_right_pads_and_marks_candidates():
    batch = Batch.collate([[5, 6, 7], [8]], [[1, 2], [3, 4, 9]], [1, 2], pad_id=0)
    assert batch.input_ids.tolist() == [[5, 6, 7], [8, 0, 0]]
    assert batch.last.tolist() == [2, 0]
    assert batch.candidate_mask.tolist() == [[True, True, False], [True, True, True]]
    assert batch.tokens == 4


@pytest.mark.slow
def test_loss_equals_negative_log_of_the_served_restricted_softmax(engine, tmp_path):
    record = parse_record(RECORD, tmp_path / "d.jsonl", 1)
    examples = encode_records(engine, [record], max_length=4096)
    assert [e.question for e in examples] == ["refund", "dept", "urgency", "approved"]

    # The tokens trained on are the whole served prompt, tokenized as one string.
    prefix_text = P.render_prefix(engine.format, record.request.state, engine.context,
                                  engine.specials)
    positions = [engine.question_position(q) for q in record.request.questions]
    for example, position in zip(examples, positions):
        assert list(example.ids) == engine.backend.encode(prefix_text + position.suffix)
        assert list(example.candidates) == [lb.token_id for lb in position.labels]

    # The engine's served logits (shared prefix + packed suffixes) ...
    served = engine.score_positions(prefix_text, positions).logits
    # ... and the trainer's, batched with padding (different lengths and candidate counts).
    model = engine.backend.model
    with torch.no_grad():
        batch = collate(examples, engine.backend.device)
        logits = decision_logits(model, batch)
        losses = restricted_cross_entropy(logits, batch.targets, "none").tolist()
    for i, (example, row) in enumerate(zip(examples, served)):
        k = len(example.candidates)
        assert logits[i, :k].tolist() == pytest.approx(row, abs=2e-3)
        assert torch.isinf(logits[i, k:]).all()
        expected = -math.log(restricted_softmax(row)[example.target])
        assert losses[i] == pytest.approx(expected, abs=1e-3)
    assert [e.target for e in examples] == [0, 0, 2, 1]


@pytest.mark.slow
def test_rotated_option_orders_move_the_answer_with_its_option(engine, tmp_path):
    """--option-orders rotations: each example is one of the prompts debias=rotations serves,
    and its target is where the gold option went, so the letters carry no class."""
    record = parse_record(RECORD, tmp_path / "d.jsonl", 1)
    dept = record.request.questions[1]
    prefix_text = P.render_prefix(engine.format, record.request.state, engine.context,
                                  engine.specials)
    served = {tuple(engine.backend.encode(prefix_text + pos.suffix)): order
              for pos, order in engine.readings(dept, "rotations")}
    assert len(served) == 3
    drawn = set()
    for seed in range(8):
        examples = encode_records(engine, [record], 4096, "rotations", seed)
        assert [e.question for e in examples] == ["refund", "dept", "urgency", "approved"]
        example = examples[1]
        order = served[example.ids]  # a KeyError: not a served rotation
        assert dept.options[order[example.target]] == "billing"
        drawn.add(order)
    assert len(drawn) > 1  # the draw moves the gold option between letters
    declared = encode_records(engine, [record], 4096)[1]
    assert served[declared.ids] == (0, 1, 2) and declared.target == 0
