"""Text generation for one resident model: prompts, output limits, and the decode scheduler.

The routes, the CLI and ``DecisionEngine.generate`` all go through :class:`TextGenerator`:
it renders chat messages with the model's own template, checks that the prompt and the output
limit fit (input is never truncated, a limit is never raised or lowered silently), and hands
sequences to the model's one :class:`~onepass.generate.scheduler.GenerationScheduler`.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from onepass.backends.base import capabilities, fewest_tokens
from onepass.contract import ContractError
from onepass.generate.chat import normalize_messages, plain_transcript, starts_with_bos
from onepass.generate.pace import DEFAULT_STREAM_SLOWDOWN
from onepass.generate.sampling import SamplingParams, check_vocab
from onepass.generate.scheduler import (
    DEFAULT_MAX_SEQUENCES,
    DEFAULT_STEP_TOKENS,
    Delta,
    Finish,
    GenerationScheduler,
    GenerationStream,
    TokenInfo,
)
from onepass.limits import check_vocabulary, output_room, too_long

DEFAULT_MAX_OUTPUT_TOKENS = 1024


@dataclass(frozen=True)
class Generation:
    """One finished sequence."""

    text: str
    finish_reason: str  # stop | length (cancelled/error never reach a caller as a result)
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int
    tokens: tuple[TokenInfo, ...] = ()


class TextGenerator:
    """Generation on one backend: one scheduler, one arena, the model's limits."""

    def __init__(
        self,
        backend: Any,
        *,
        max_input_tokens: int,
        default_max_output_tokens: int = DEFAULT_MAX_OUTPUT_TOKENS,
        max_sequences: int = DEFAULT_MAX_SEQUENCES,
        step_tokens: int = DEFAULT_STEP_TOKENS,
        max_waiting: int = 64,
        on_step: Any = None,
        max_request_sequences: int | None = None,
        stream_slowdown: float | None = DEFAULT_STREAM_SLOWDOWN,
    ):
        if default_max_output_tokens < 1:
            raise ValueError("default_max_output_tokens must be at least 1")
        self.backend = backend
        self.capabilities = capabilities(backend)
        self.max_input_tokens = max_input_tokens
        self.default_max_output_tokens = default_max_output_tokens
        # a backend with its own step calls for generation alone (llama.cpp) keeps no rows
        # for decisions: it scores them itself
        steps = backend if self.capabilities.steps else backend.generation_steps(max_sequences)
        self.scheduler = GenerationScheduler(
            steps, max_sequences=max_sequences, step_tokens=step_tokens,
            max_waiting=max_waiting, on_step=on_step, max_request_sequences=max_request_sequences,
            decision_rows=None if steps is backend else 0, stream_slowdown=stream_slowdown,
        )

    @property
    def context_length(self) -> int:
        return min(self.backend.context_length, self.scheduler.generation_rows)

    # ------------------------------------------------------------------ prompts

    def chat_prompt(self, messages: Any, field: str = "messages",
                    template_kwargs: Mapping[str, Any] | None = None) -> list[int]:
        """Token ids of ``messages`` rendered by the model's chat template (an open
        assistant turn at the end); ``template_kwargs``: more template variables (a
        request's ``chat_template_kwargs``, its reasoning switch)."""
        normalized = normalize_messages(messages, field)
        if self.backend.chat_template:
            try:
                text = self.backend.render_chat(normalized, **(template_kwargs or {}))
            except Exception as exc:  # the template's own refusal (e.g. role order)
                raise ContractError(
                    field, f"the model's chat template refused these messages: {exc}"
                ) from None
            return self.encode_prompt(text, field, bos=not starts_with_bos(self.backend, text))
        return self.encode_prompt(plain_transcript(normalized), field)

    def encode_prompt(self, text: str, field: str, *, bos: bool = True) -> list[int]:
        """Token ids of a prompt's text; one whose length alone proves it over
        ``max_input_tokens`` (:func:`~onepass.backends.base.fewest_tokens`) is refused
        before it is tokenized, so a 2 MB prompt costs milliseconds, not seconds."""
        fewest = fewest_tokens(self.backend, text)
        if fewest > self.max_input_tokens:
            raise too_long(field, f"at least {fewest}", self.max_input_tokens)
        return self.backend.encode(text, bos=bos)

    def text_prompt(self, prompt: Any, field: str = "prompt") -> list[int]:
        """A completions prompt: a string, or token ids checked against the vocabulary."""
        if isinstance(prompt, str):
            if not prompt:
                raise ContractError(field, "expected a non-empty string or token ids")
            return self.encode_prompt(prompt, field)
        if isinstance(prompt, list) and prompt and all(
            isinstance(t, int) and not isinstance(t, bool) for t in prompt
        ):
            check_vocabulary(field, prompt, self.backend.vocab_size)
            return list(prompt)
        raise ContractError(field, "expected a non-empty string or a non-empty array of "
                            "token ids")

    def output_limit(
        self, prompt_tokens: int, requested: int | None, *, field: str = "max_tokens",
        prompt_field: str = "messages",
    ) -> int:
        """The output limit this prompt gets: the requested one if it fits the context, else
        a 400; the model default (capped by the room left) when none was asked for."""
        if prompt_tokens > self.max_input_tokens:
            raise too_long(prompt_field, prompt_tokens, self.max_input_tokens)
        room = output_room(prompt_tokens, self.context_length, requested, field=field,
                           prompt_field=prompt_field)
        return min(self.default_max_output_tokens, room) if requested is None else requested

    # ------------------------------------------------------------------ running

    def start(
        self, prompt: Sequence[int], params: SamplingParams, max_tokens: int, n: int = 1,
        grammar: Any = None, deadline: float | None = None,
    ) -> list[GenerationStream]:
        """Submit ``n`` sequences of the same prompt (seed + i for the i-th), each with its own
        matcher of ``grammar`` (a compiled :class:`~onepass.generate.grammar.Grammar`) if any.
        They are one request: it runs at most the scheduler's per-request share of them at
        once (the others follow as those end); if none has started by ``deadline``
        (monotonic seconds) they all end with reason "deadline".

        Stop strings and a grammar are refused together: a stop string inside the structure
        would end it early with reason "stop", and a "stop" under a grammar means complete."""
        check_vocab(params, self.backend.vocab_size)
        if grammar is not None and params.stop:
            raise ContractError("stop", "stop strings cannot be combined with a grammar or a "
                                "structured response_format: the grammar decides where it ends")
        streams: list[GenerationStream] = []
        share = self.scheduler.share(deadline)
        try:
            for i in range(n):
                streams.append(self.scheduler.submit(prompt, params, max_tokens, seed_offset=i,
                                                     grammar=grammar, request=share))
        except Exception:
            for stream in streams:
                stream.cancel()
            raise
        return streams

    def run(
        self, prompt: Sequence[int], params: SamplingParams, max_tokens: int, n: int = 1,
        grammar: Any = None,
    ) -> list[Generation]:
        """Generate to the end (blocking); one :class:`Generation` per sequence."""
        return [collect(s) for s in self.start(prompt, params, max_tokens, n, grammar)]

    def stream_text(
        self, prompt: Sequence[int], params: SamplingParams, max_tokens: int,
        grammar: Any = None,
    ) -> TextStream:
        """The text as it is generated (see :class:`TextStream`)."""
        (stream,) = self.start(prompt, params, max_tokens, grammar=grammar)
        return TextStream(stream)


class TextStream:
    """Iterates over the text deltas of one sequence; ``finish`` holds its :class:`Finish`
    (reason and token usage) once the iteration ends. Closing the iterator early cancels the
    sequence and frees its slot."""

    def __init__(self, stream: GenerationStream):
        self._stream = stream
        self.finish: Finish | None = None

    def __iter__(self) -> Iterator[str]:
        try:
            for event in self._stream:
                if isinstance(event, Delta):
                    if event.text:
                        yield event.text
                else:
                    self.finish = event
                    if event.error is not None:
                        raise event.error
        finally:
            self._stream.cancel()


def collect(stream: GenerationStream) -> Generation:
    """Wait for one stream's end and join its deltas."""
    texts: list[str] = []
    tokens: list[TokenInfo] = []
    for event in stream:
        if isinstance(event, Delta):
            texts.append(event.text)
            tokens.extend(event.tokens)
        else:
            if event.error is not None:
                raise event.error
            return Generation("".join(texts), event.reason, event.prompt_tokens,
                              event.completion_tokens, event.cached_tokens, tuple(tokens))
    raise RuntimeError("the stream ended without a finish event")
