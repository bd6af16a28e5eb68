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


def test_the_soft_target_loss_is_the_hand_computed_cross_entropy():
    """Distillation's loss: -sum_k p_k log softmax(logits)_k over the candidates only, i.e.
    the KL divergence from the target plus the target's own entropy; a one-hot target reads
    exactly (bit for bit) what its index does."""
    logits = torch.tensor([[2.0, -1.0, 0.5, float("-inf")], [0.1, 0.2, float("-inf"),
                                                              float("-inf")]])
    targets = torch.tensor([[0.5, 0.2, 0.3, 0.0], [0.0, 1.0, 0.0, 0.0]])
    losses = restricted_cross_entropy(logits, targets, "none").tolist()
    z = math.exp(2.0) + math.exp(-1.0) + math.exp(0.5)
    by_hand = -(0.5 * (2.0 - math.log(z)) + 0.2 * (-1.0 - math.log(z))
                + 0.3 * (0.5 - math.log(z)))
    assert losses[0] == pytest.approx(by_hand, abs=1e-6)  # 1.1690...
    entropy = -sum(p * math.log(p) for p in (0.5, 0.2, 0.3))
    q = restricted_softmax([2.0, -1.0, 0.5])
    kl = sum(p * math.log(p / qk) for p, qk in zip((0.5, 0.2, 0.3), q))
    assert losses[0] == pytest.approx(entropy + kl, abs=1e-6)
    index = restricted_cross_entropy(logits, torch.tensor([0, 1]), "none")
    assert losses[1] == index[1].item()  # one-hot: exactly the gold index's loss
    # a model already at the target pays only the target's entropy (KL 0), and no less
    at_target = torch.log(torch.tensor([[0.5, 0.2, 0.3]]))
    assert restricted_cross_entropy(at_target, torch.tensor([[0.5, 0.2, 0.3]])).item() == \
        pytest.approx(entropy, abs=1e-6)


def test_collate_right_pads_and_marks_candidates():
    batch = Batch.collate([[5, 6, 7], [8]], [[1, 2], [3, 4, 9]], [1, 2], pad_id=0)
    assert batch.input_ids.tolist() == [[5, 6, 7], [8, 0, 0]]
    assert batch.last.tolist() == [2, 0]
    assert batch.candidate_mask.tolist() == [[True, True, False], [True, True, True]]
    assert batch.tokens == 4
    assert batch.distributions.tolist() == [[0.0, 1.0, 0.0], [0.0, 0.0, 1.0]]  # one-hot golds
    soft = Batch.collate([[5, 6, 7], [8]], [[1, 2], [3, 4, 9]], [1, 2], pad_id=0,
                         distributions=[(0.25, 0.75), None])
    assert soft.distributions.tolist() == [[0.25, 0.75, 0.0], [0.0, 0.0, 1.0]]


def test_a_soft_target_moves_with_its_options_under_rotations(engine, tmp_path):
    """``--option-orders rotations`` reads a choice in a rotated order: its target
    distribution is reordered with the options, so each candidate keeps its own probability."""
    record = parse_record({"state": "charged twice", "questions": {"dept": {
        "type": "choice", "instructions": "Which team?",
        "criteria": {"sales": None, "billing": None, "logistics": None, "support": None},
        "probabilities": {"sales": 0.1, "billing": 0.6, "logistics": 0.2, "support": 0.1}}}},
        tmp_path / "d.jsonl", 1)
    seen = set()
    for seed in range(12):
        (example,) = encode_records(engine, [record], 4096, "rotations", seed)
        labels = {lb.token_id: lb for lb in engine.question_position(
            record.request.questions[0]).labels}
        assert example.distribution is not None and sum(example.distribution) == \
            pytest.approx(1.0)
        assert example.distribution[example.target] == max(example.distribution)
        seen.add(example.distribution)
        assert len(labels) == 4
    assert len(seen) > 1  # the draws did rotate it
    assert all(sorted(d) == pytest.approx([0.1, 0.1, 0.2, 0.6]) for d in seen)


def test_the_default_trains_on_the_name_order_the_engine_serves_by_default(engine, tmp_path):
    """The trainer's default order is the serving default's (``debias name-order``): a choice
    declared out of name order is trained on the name-sorted prompt, its target the gold
    option's place there; ``declared`` keeps the record's order."""
    record = parse_record({"state": "charged twice", "questions": {"dept": {
        "type": "choice", "instructions": "Which team?", "answer": "billing",
        "criteria": {"support": None, "logistics": None, "billing": None}}}},
        tmp_path / "d.jsonl", 1)
    q = record.request.questions[0]
    prefix = P.render_prefix(engine.format, record.request.state, engine.context,
                             engine.specials)
    ((named, order),) = engine.readings(q, "name-order")
    assert order == (2, 1, 0)
    (example,) = encode_records(engine, [record], 4096)
    assert list(example.ids) == engine.backend.encode(prefix + named.suffix)
    assert example.target == 0  # billing sorts first
    (declared,) = encode_records(engine, [record], 4096, "declared")
    assert list(declared.ids) == engine.backend.encode(
        prefix + engine.question_position(q).suffix)
    assert declared.target == 2


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


def test_training_on_a_target_distribution_serves_that_distribution(tmp_path):
    """Distillation's plumbing end to end (a tiny random model: plumbing, not learning): an
    adapter trained on one target distribution serves that distribution, not its argmax (a
    gold label would drive the answer toward certainty)."""
    from train_support import tiny_base, write_dataset

    from onepass.engine import DecisionEngine
    from onepass.train.config import resolve_config
    from onepass.train.loop import train

    target = {"billing": 0.6, "logistics": 0.3, "support": 0.1}
    records = [{"state": f"Order {i}: the parcel is late.", "questions": {"team": {
        "type": "choice", "instructions": "Which team?",
        "criteria": {"billing": "payments", "logistics": "shipping", "support": None},
        "probabilities": target}}} for i in range(4)]
    dataset = write_dataset(tmp_path / "soft.jsonl", records)
    base = tiny_base(tmp_path / "base")
    out = tmp_path / "adapter"
    config = resolve_config({
        ("run", "method"): "lora", ("run", "model"): str(base), ("run", "output_directory"):
        str(out), ("dataset", "path"): str(dataset), ("run", "epochs"): 30,
        ("run", "batch_size"): 4, ("run", "learning_rate"): 3e-2, ("run", "warmup_steps"): 1,
        ("run", "lora_rank"): 4, ("run", "lora_alpha"): 8.0, ("run", "lr_schedule"): "constant"})
    config.dataset.validation_path = str(dataset)
    result = train(config, show_progress=False)
    entropy = -sum(p * math.log(p) for p in target.values())
    kl = result.history[-1]["validation_loss"] - entropy  # cross-entropy = entropy + KL
    assert -1e-6 <= kl < 0.01, result.history[-1]
    engine = DecisionEngine.from_pretrained(str(base), adapter=str(out), dtype="float32")
    served = engine.answer({"state": records[0]["state"], "questions": {"team": {
        k: v for k, v in records[0]["questions"]["team"].items() if k != "probabilities"}}})
    probabilities = served["answers"]["team"]["probabilities"]
    assert probabilities == pytest.approx(target, abs=0.05)
