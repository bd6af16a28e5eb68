"""Token ids to streamed text: incremental detokenization and stop strings. Pure (no torch).

Both classes do work proportional to what arrives (plus a bounded window), never re-reading
the whole text, so streaming a long answer stays linear.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

CONTEXT_TOKENS = 5  # prompt ids kept as decoding context (vLLM keeps the same number)


class IncrementalDetokenizer:
    """Turns generated token ids into text deltas whose concatenation is the full decode.

    Decoding one token alone is wrong in two ways: a multi-byte character split across tokens
    decodes to U+FFFD, and SentencePiece-style tokenizers drop a word's leading space at the
    start of a decode. So (the prefix/read offsets of vLLM and TGI) each step decodes a short
    window, the tokens emitted last time plus the unread ones, emits what it adds to the
    decode of the emitted part alone, and holds that back while it ends with U+FFFD. Tokens
    before the window are forgotten.

    `decode` is the tokenizer's decode (special tokens and space clean-up chosen by the
    caller; turn clean-up off, it rewrites text across the window edge). `context` is the
    prompt's ids: its last few give the first generated token its left context.
    """

    def __init__(self, decode: Callable[[Sequence[int]], str], context: Sequence[int] = ()):
        self._decode = decode
        self._ids: list[int] = list(context[-CONTEXT_TOKENS:])
        self._read = len(self._ids)  # ids[:read] are emitted (or context); ids[0] starts the window
        self._read_text: str | None = None  # decode(ids[:read]), cached until the window moves

    def push(self, token_id: int) -> str:
        """Add one token; return the text it completes (may be empty while a character is split)."""
        self._ids.append(token_id)
        return self._advance(final=False)

    def flush(self) -> str:
        """Return whatever is held back (an unfinished character decodes to U+FFFD)."""
        return self._advance(final=True)

    def _advance(self, *, final: bool) -> str:
        if self._read_text is None:
            self._read_text = self._decode(self._ids[: self._read])
        text = self._decode(self._ids)
        if len(text) <= len(self._read_text) or (text.endswith("\ufffd") and not final):
            return ""
        delta = text[len(self._read_text):]
        del self._ids[: self._read]  # the unread tokens become the next window's prefix
        self._read = len(self._ids)
        self._read_text = None
        return delta


class StopMatcher:
    """Cuts streamed text at the first stop string; the stop string itself is never emitted.

    A stop string may span deltas, so text that could still be the start of one is held back
    until it either completes (stop) or cannot (released). "First" means first to complete in
    the text, the longest on a tie: the result never depends on how the text was split.
    Each call scans only the held-back tail (shorter than the longest stop string) plus the
    new delta.
    """

    def __init__(self, stops: Sequence[str]):
        if any(not s for s in stops):
            raise ValueError("stop strings must be non-empty")
        self._stops = tuple(stops)
        self._firsts = frozenset(s[0] for s in self._stops)
        self._longest = max(map(len, self._stops), default=0)
        self._held = ""
        self.matched: str | None = None  # the stop string that ended the text, once found

    def push(self, delta: str) -> tuple[str, bool]:
        """Return (text safe to emit now, whether a stop string was found)."""
        if self.matched is not None:
            return "", True
        if not self._stops:
            return delta, False
        text = self._held + delta
        hit = self._first_stop(text)
        if hit is not None:
            start, self.matched = hit
            self._held = ""
            return text[:start], True
        cut = self._partial_start(text)
        self._held = text[cut:]
        return text[:cut], False

    def flush(self) -> str:
        """Release the held-back text (generation ended for another reason)."""
        held, self._held = self._held, ""
        return held

    def _first_stop(self, text: str) -> tuple[int, str] | None:
        hits = []  # (end, -length, start, stop): the earliest end wins, then the longest
        for stop in self._stops:
            start = text.find(stop)  # the first occurrence is the first to complete
            if start >= 0:
                hits.append((start + len(stop), -len(stop), start, stop))
        if not hits:
            return None
        _, _, start, stop = min(hits)
        return start, stop

    def _partial_start(self, text: str) -> int:
        """Where the longest tail of `text` that begins some stop string starts (len if none)."""
        for start in range(max(0, len(text) - self._longest + 1), len(text)):
            if text[start] in self._firsts and any(s.startswith(text[start:]) for s in self._stops):
                return start
        return len(text)
