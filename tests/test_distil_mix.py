"""Tests for scripts/distil_mix.py: the templated distillation mix."""

import importlib.util
import json
import sys
from collections import Counter
from pathlib import Path

import pytest

from onepass.train.dataset import parse_record

_PATH = Path(__file__).parents[1] / "scripts" / "distil_mix.py"
_spec = importlib.util.spec_from_file_location("distil_mix", _PATH)
dm = importlib.util.module_from_spec(_spec)
sys.modules["distil_mix"] = dm
_spec.loader.exec_module(dm)


@pytest.fixture(scope="module")
def train():
    return dm.generate("train", 2000, seed=0)


@pytest.fixture(scope="module")
def heldout():
    return dm.generate("heldout", 1000, seed=0)


def test_domains_disjoint_and_counts():
    assert len(dm.TRAIN_DOMAINS) >= 16 and len(dm.HELDOUT_DOMAINS) >= 4
    assert not set(dm.TRAIN_DOMAINS) & set(dm.HELDOUT_DOMAINS)


def test_deterministic():
    a = [it.record for it in dm.generate("train", 200, seed=3)]
    b = [it.record for it in dm.generate("train", 200, seed=3)]
    c = [it.record for it in dm.generate("train", 200, seed=4)]
    assert a == b
    assert a != c
    assert dm.generate("heldout", 50, 1) == dm.generate("heldout", 50, 1)


def test_bad_split():
    with pytest.raises(ValueError):
        dm.generate("bogus", 10)


def test_train_split_has_nothing_held_out(train):
    held = dm.heldout_templates()
    for it in train:
        assert it.domain in dm.TRAIN_DOMAINS
        assert not set(it.templates) & held, it.templates


def test_heldout_split_only_held_out(heldout):
    held = dm.heldout_templates()
    domains = Counter()
    for it in heldout:
        if it.domain in dm.HELDOUT_DOMAINS:
            domains["heldout"] += 1
        else:
            assert it.domain in dm.TRAIN_DOMAINS
            assert set(it.templates) <= held, it.templates
            domains["train"] += 1
    assert domains["heldout"] > 100 and domains["train"] > 100


def test_heldout_templates_quarter_per_kind():
    held = dm.heldout_templates()
    every = set()
    for it in dm.generate("train", 3000, 0) + dm.generate("heldout", 3000, 0):
        every.update(it.templates)
    for kind in ("choice", "score", "is", "fact"):
        ids = {t for t in every if t.split(".")[1] == kind}
        assert ids
        share = len(ids & held) / len(ids)
        assert share >= 0.25 - 0.03, (kind, share)


@pytest.mark.parametrize("split", ["train", "heldout"])
def test_records_validate_and_gold_among_candidates(split):
    items = dm.generate(split, 1500, seed=7)
    for i, it in enumerate(items, 1):
        rec = it.record
        assert set(rec) == {"state", "questions"}
        parse_record(json.loads(json.dumps(rec, ensure_ascii=False)), "mix", i)
        qs = rec["questions"]
        assert 1 <= len(qs) <= 4
        assert list(qs) == [f"q{j + 1}" for j in range(len(qs))]
        assert len(it.templates) == len(qs)
        for q in qs.values():
            if q["type"] == "noul":
                assert q["answer"] in ("yes", "no")
            else:
                assert q["answer"] in q["criteria"]
            if q["type"] == "choice":
                assert 2 <= len(q["criteria"]) <= 20
            if q["type"] == "score":
                assert 3 <= len(q["criteria"]) <= 5


def test_coverage(train):
    types = Counter(q["type"] for it in train for q in it.record["questions"].values())
    assert set(types) == {"noul", "choice", "score"}
    layouts = Counter(it.layout for it in train)
    assert set(layouts) == {"text", "json", "long"}
    assert all(isinstance(it.record["state"], dict) == (it.layout == "json") for it in train)
    sizes = [len(q["criteria"]) for it in train for q in it.record["questions"].values()
             if q["type"] == "choice"]
    assert min(sizes) == 2 and max(sizes) >= 15
    assert sum(7 <= s <= 12 for s in sizes) > 50
    nouls = [q["answer"] for it in train for q in it.record["questions"].values()
             if q["type"] == "noul"]
    assert 0.4 <= nouls.count("yes") / len(nouls) <= 0.6
    assert len({it.domain for it in train}) == len(dm.TRAIN_DOMAINS)


def test_gold_position_roughly_uniform(train):
    first = total = 0
    for it in train:
        for q in it.record["questions"].values():
            if q["type"] == "choice" and len(q["criteria"]) == 2:
                total += 1
                first += list(q["criteria"]).index(q["answer"]) == 0
    assert total > 50 and 0.3 <= first / total <= 0.7


def test_complement_pairs_consistent(train):
    pairs = 0
    for it in train:
        qs = list(it.record["questions"].values())
        for a in qs:
            for b in qs:
                if a["type"] == b["type"] == "noul" and a is not b:
                    na = a["instructions"].replace(" is not ", " is ").replace(" does not ", " ")
                    if " not " in a["instructions"] and na == b["instructions"]:
                        pairs += 1
                        assert a["answer"] != b["answer"]
    assert pairs > 0


def _long_position(it):
    text = it.record["state"]
    fillers = dm.filler_sentences(it.domain)
    before = after = 0
    while True:
        hit = next((f for f in fillers if text.startswith(f + " ")), None)
        if hit is None:
            break
        text, before = text[len(hit) + 1:], before + 1
    while True:
        hit = next((f for f in fillers if text.endswith(" " + f)), None)
        if hit is None:
            break
        text, after = text[:-len(hit) - 1], after + 1
    return before, after, text


def test_long_states_put_deciding_sentence_in_middle_third(train):
    longs = [it for it in train if it.layout == "long"]
    assert longs
    for it in longs:
        before, after, rest = _long_position(it)
        n = before + after + 1
        assert 8 <= n <= 16
        assert not any(f in rest for f in dm.filler_sentences(it.domain)), rest
        assert n / 3 <= before < 2 * n / 3, (before, n)


def test_cli(tmp_path, capsys):
    out = tmp_path / "mix.jsonl"
    assert dm.main(["--split", "heldout", "--states", "30", "--seed", "2",
                    "--output", str(out)]) == 0
    lines = out.read_text(encoding="utf-8").splitlines()
    meta = (tmp_path / "mix.meta.jsonl").read_text(encoding="utf-8").splitlines()
    assert len(lines) == len(meta) == 30
    items = dm.generate("heldout", 30, 2)
    assert [json.loads(x) for x in lines] == [it.record for it in items]
    assert json.loads(meta[0]) == {"domain": items[0].domain, "layout": items[0].layout,
                                   "templates": list(items[0].templates)}
    assert "30 states" in capsys.readouterr().out
