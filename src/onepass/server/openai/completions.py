"""Text completions on the wire: a ``/v1/completions`` body → :class:`CompletionRequest`
(``prompt`` as a string or token ids, ``echo``, ``logprobs`` as an int, ``max_tokens`` 0 with
``echo`` to score the prompt only), and choices → ``text_completion`` objects with their
log-probabilities (:class:`TextLogprobs`). Pure."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from onepass.contract import ContractError, _describe
from onepass.generate.grammar import GrammarSpec, grammar_request
from onepass.generate.params import SamplingParams
from onepass.server.openai.common import (
    COMPLETION_FIELDS,
    MAX_CHOICES,
    MAX_COMPLETION_LOGPROBS,
    Usage,
    _bool,
    _check_fields,
    _int,
    _model,
    _sampling,
    _stream_options,
    _structured,
)


@dataclass(frozen=True)
class CompletionRequest:
    """A validated /v1/completions body. ``max_tokens == 0`` (with echo) scores the prompt."""

    model: str | None
    prompt: str | list[int]
    params: SamplingParams
    max_tokens: int | None
    n: int
    stream: bool
    include_usage: bool
    logprobs: int | None
    echo: bool
    grammar: GrammarSpec | None = None

    @property
    def scoring(self) -> bool:
        return self.max_tokens == 0


def parse_completion(body: Any) -> CompletionRequest:
    body = _check_fields(body, COMPLETION_FIELDS, "POST /v1/completions")
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]  # a batch of one prompt, as the SDK may send it
    if isinstance(prompt, list) and prompt and all(isinstance(p, (str, list)) for p in prompt):
        raise ContractError("prompt", "one prompt per request (a string or an array of token "
                            "ids); send several prompts as separate requests")
    if not (isinstance(prompt, str) and prompt) and not (
        isinstance(prompt, list) and prompt
        and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt)
    ):
        raise ContractError("prompt", "expected a non-empty string or a non-empty array of "
                            f"token ids, got {_describe(prompt)}")
    max_tokens = _int(body, "max_tokens", 0, None)
    echo = _bool(body, "echo")
    if max_tokens == 0 and not echo:
        raise ContractError("max_tokens", "expected an integer >= 1 (0 is only for scoring "
                            "the prompt, with echo: true)")
    logprobs = _int(body, "logprobs", 0, MAX_COMPLETION_LOGPROBS)
    stream = _bool(body, "stream")
    params = _sampling(body, logprobs, max_tokens)
    spec = grammar_request(None, body.get("grammar"))
    if spec is not None and max_tokens == 0:
        raise ContractError("grammar", "scoring the prompt (max_tokens 0) generates nothing "
                            "to constrain; remove the grammar")
    return CompletionRequest(
        model=_model(body), prompt=prompt, params=params, max_tokens=max_tokens,
        n=_int(body, "n", 1, MAX_CHOICES) or 1, stream=stream,
        include_usage=_stream_options(body, stream), logprobs=logprobs, echo=echo,
        grammar=_structured(spec, params),
    )


@dataclass
class TextLogprobs:
    """Completions' parallel logprob arrays; ``offset`` is where the next token's text starts
    in the choice text."""

    tokens: list[str] = field(default_factory=list)
    token_logprobs: list[float | None] = field(default_factory=list)
    top_logprobs: list[dict[str, float] | None] = field(default_factory=list)
    text_offset: list[int] = field(default_factory=list)
    offset: int = 0

    def add(self, text: str, logprob: float | None, top: dict[str, float] | None) -> None:
        self.tokens.append(text)
        self.token_logprobs.append(logprob)
        self.top_logprobs.append(top)
        self.text_offset.append(self.offset)
        self.offset += len(text)

    def add_generated(self, tokens: Iterable[Any]) -> None:
        for t in tokens:
            self.add(t.text, t.logprob, dict(t.top))

    def add_prompt(self, ids: Sequence[int], scored: Sequence[tuple[float, Any]],
                   decode: Callable[[Sequence[int]], str]) -> None:
        """The echoed prompt: the first token has no logprob (nothing precedes it)."""
        for i, token in enumerate(ids):
            if i == 0:
                self.add(decode([token]), None, None)
            else:
                logprob, top = scored[i - 1]
                self.add(decode([token]), logprob, {decode([t]): lp for t, lp in top})

    def wire(self) -> dict[str, Any]:
        return {"tokens": self.tokens, "token_logprobs": self.token_logprobs,
                "top_logprobs": self.top_logprobs, "text_offset": self.text_offset}

    def take(self) -> dict[str, Any]:
        """The entries so far (for one stream chunk), keeping ``offset`` running."""
        out = self.wire()
        self.tokens, self.token_logprobs, self.top_logprobs, self.text_offset = [], [], [], []
        return out


def text_completion(
    cid: str, created: int, model: str, texts: Sequence[str], finishes: Sequence[str | None],
    logprobs: Sequence[TextLogprobs | None], usage: Usage | None, *, first_index: int = 0,
) -> dict[str, Any]:
    """A ``text_completion`` object (also each streamed chunk: one choice, ``first_index``
    its index)."""
    out: dict[str, Any] = {
        "id": cid, "object": "text_completion", "created": created, "model": model,
        "choices": [{"index": first_index + i, "text": text,
                     "logprobs": lp.wire() if lp is not None else None,
                     "finish_reason": finish}
                    for i, (text, finish, lp) in enumerate(zip(texts, finishes, logprobs))],
        "system_fingerprint": None,
    }
    if usage is not None:
        out["usage"] = usage.chat()
    return out
