"""Streaming text: incremental detokenization (real SmolLM2 tokenizer and a SentencePiece-style
fake) and stop strings across delta boundaries."""

from __future__ import annotations

import random

import pytest

from onepass.generate.text import IncrementalDetokenizer, StopMatcher

TEXTS = [
    "Hello 👋🏽 wörld — 日本語のテキスト. ñ  double  spaces\n new line 🎉 , ok",
    "  two leading spaces, Ça va? Ünïcödé ∑ 𝔘𝔫𝔦𝔠𝔬𝔡𝔢 🇫🇷🇯🇵 family 👨‍👩‍👧‍👦 end",
    "中文测试：你好，世界！ 한국어 텍스트 العربية עברית\t tab",
]


@pytest.fixture(scope="module")
def tok():
    from transformers import AutoTokenizer

    from onepass.models import resolve

    return AutoTokenizer.from_pretrained(resolve(None).path)


def stream(detok: IncrementalDetokenizer, ids: list[int]) -> list[str]:
    return [detok.push(i) for i in ids] + [detok.flush()]


# --------------------------------------------------------------------------- real tokenizer


@pytest.mark.parametrize("text", TEXTS)
def test_deltas_concatenate_to_the_full_decode(tok, text):
    ids = tok.encode(text, add_special_tokens=False)
    calls: list[int] = []

    def decode(window):
        calls.append(len(window))
        return tok.decode(window, skip_special_tokens=True)

    naive = "".join(tok.decode([i]) for i in ids)
    assert "\ufffd" in naive  # one token at a time really does split characters here
    deltas = stream(IncrementalDetokenizer(decode), ids)
    assert "".join(deltas) == tok.decode(ids) == text
    assert not any("\ufffd" in d for d in deltas)
    assert deltas[-1] == ""  # nothing was left held back
    assert max(calls) <= 8  # a short window per step, never the whole text


def test_prompt_context_gives_the_first_token_its_left_context(tok):
    prompt = tok.encode("The answer is", add_special_tokens=False)
    generated = tok.encode(" 42 🎉 définitivement", add_special_tokens=False)
    deltas = stream(IncrementalDetokenizer(tok.decode, prompt), generated)
    full = tok.decode(prompt + generated)
    assert "".join(deltas) == full[len(tok.decode(prompt)):] == " 42 🎉 définitivement"


def test_flush_releases_an_unfinished_character(tok):
    ids = tok.encode("ok 🎉", add_special_tokens=False)[:-1]  # cut inside the emoji's bytes
    detok = IncrementalDetokenizer(tok.decode)
    pushed = "".join(detok.push(i) for i in ids)
    assert "\ufffd" not in pushed
    tail = detok.flush()
    assert tail.endswith("\ufffd") and pushed + tail == tok.decode(ids)
    assert detok.flush() == ""


def test_special_tokens_skipped_by_the_callers_decode(tok):
    eos = tok.eos_token_id
    ids = tok.encode("Bonjour à tous", add_special_tokens=False)
    stream_ids = ids[:2] + [eos] + ids[2:]
    deltas = stream(
        IncrementalDetokenizer(lambda w: tok.decode(w, skip_special_tokens=True)), stream_ids
    )
    assert "".join(deltas) == tok.decode(stream_ids, skip_special_tokens=True)


# --------------------------------------------------------------------------- SentencePiece-style

SP_PIECES = ["▁Hello", "▁w", "rld", "▁", "<0xC3>", "<0xB6>", "<0xF0>", "<0x9F>", "<0x8E>",
             "<0x89>", "▁日本", "!"]


def sp_decode(ids) -> str:
    """SentencePiece semantics: byte pieces, ▁ for a space, one leading space dropped."""
    data = b""
    for i in ids:
        piece = SP_PIECES[i]
        if piece.startswith("<0x"):
            data += bytes([int(piece[3:5], 16)])
        else:
            data += piece.replace("▁", " ").encode()
    text = data.decode("utf-8", errors="replace")
    return text[1:] if text.startswith(" ") else text


def test_sentencepiece_leading_spaces_and_split_bytes():
    # "Hello wörld 🎉 日本!" with ö as two byte pieces and 🎉 as four
    ids = [0, 1, 4, 5, 2, 3, 6, 7, 8, 9, 10, 11]
    naive = "".join(sp_decode([i]) for i in ids)
    assert naive != sp_decode(ids)  # per-token decode drops the spaces
    deltas = stream(IncrementalDetokenizer(sp_decode), ids)
    assert "".join(deltas) == sp_decode(ids) == "Hello wörld 🎉 日本!"
    assert deltas[1] == " w" and deltas[2] == "" and deltas[3] == "ö"  # held, then whole
    assert deltas[6:10] == ["", "", "", "🎉"]


def test_sentencepiece_context_keeps_the_first_space():
    deltas = stream(IncrementalDetokenizer(sp_decode, [0]), [1, 2])
    assert "".join(deltas) == " wrld"


# --------------------------------------------------------------------------- stop strings


def run(stops: list[str], deltas: list[str]) -> tuple[str, bool]:
    matcher = StopMatcher(stops)
    out = []
    for delta in deltas:
        text, stopped = matcher.push(delta)
        out.append(text)
        if stopped:
            return "".join(out), True
    return "".join(out) + matcher.flush(), False


def test_stop_split_across_deltas_is_not_emitted():
    assert run(["END"], ["foo E", "N", "D bar"]) == ("foo ", True)
    assert run(["\n\n"], ["line\n", "\nnext"]) == ("line", True)


def test_text_that_might_start_a_stop_is_held_then_released():
    matcher = StopMatcher(["abc"])
    assert matcher.push("xab") == ("x", False)
    assert matcher.push("d") == ("abd", False)
    assert matcher.push("a") == ("", False)
    assert matcher.flush() == "a"
    assert matcher.matched is None


def test_overlapping_prefixes():
    # "ab" then "ab": the first "ab" can no longer start "abc" once "abab" is seen
    assert run(["abc"], ["ab", "ab", "c"]) == ("ab", True)
    assert run(["abc"], ["a", "a", "b", "a", "b", "c", "z"]) == ("aab", True)
    # "ab" completes before "abc" could
    assert run(["abc", "ab"], ["x", "abc"]) == ("x", True)
    assert run(["aaa"], ["aa", "aa"]) == ("", True)


def test_first_to_complete_wins_whatever_the_split():
    assert run(["abcd", "bc"], ["abcd"]) == ("a", True)
    assert run(["abcd", "bc"], ["a", "b", "c", "d"]) == ("a", True)
    matcher = StopMatcher(["bc", "abc"])
    assert matcher.push("zabc") == ("z", True) and matcher.matched == "abc"  # tie: longest


def test_stop_at_the_very_start_and_after_a_stop():
    matcher = StopMatcher(["<|end|>"])
    assert matcher.push("<|end|> trailing") == ("", True)
    assert matcher.matched == "<|end|>"
    assert matcher.push("more") == ("", True)
    assert matcher.flush() == ""


def test_no_stops_passes_text_through():
    matcher = StopMatcher([])
    assert matcher.push("anything") == ("anything", False)
    assert matcher.flush() == ""
    with pytest.raises(ValueError):
        StopMatcher([""])


def reference(text: str, stops: list[str]) -> tuple[str, bool]:
    hits = [(text.find(s) + len(s), -len(s), text.find(s)) for s in stops if s in text]
    return (text[: min(hits)[2]], True) if hits else (text, False)


def test_random_splits_match_the_whole_text_reference():
    rng = random.Random(0)
    for _ in range(2000):
        stops = ["".join(rng.choices("abc", k=rng.randint(1, 4))) for _ in range(rng.randint(1, 4))]
        text = "".join(rng.choices("abcd", k=rng.randint(0, 30)))
        cuts = sorted(rng.sample(range(len(text) + 1), k=min(len(text) + 1, rng.randint(0, 8))))
        deltas = [text[i:j] for i, j in zip([0, *cuts], [*cuts, len(text)])]
        matcher = StopMatcher(stops)
        longest = max(map(len, stops))
        out, stopped = [], False
        for delta in deltas:
            emitted, stopped = matcher.push(delta)
            out.append(emitted)
            assert len(matcher._held) < longest  # bounded hold-back
            if stopped:
                break
        result = "".join(out) + ("" if stopped else matcher.flush())
        assert (result, stopped) == reference(text, stops), (text, stops, deltas)
