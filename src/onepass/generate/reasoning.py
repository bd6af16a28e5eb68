"""Reasoning models: the template's thinking switch and the split of a reply into its
reasoning (``<think>…</think>``) and its answer. Pure: no torch, so the server's wire
translation and the decision path can use it.

A Qwen3-style chat template turns reasoning on and off with the ``enable_thinking`` variable.
Decisions always render with it off (the label must be the reply's first token); generation
maps ``reasoning_effort`` onto it. The model then writes ``<think>reasoning</think>answer``;
the OpenAI wire returns the reasoning apart (``reasoning_content``, a ``reasoning`` item).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from onepass.contract import ContractError, _describe

THINKING_SWITCH = "enable_thinking"
OPEN_TAG = "<think>"
CLOSE_TAG = "</think>"
EFFORTS = ("none", "minimal", "low", "medium", "high")
"""``reasoning_effort`` values (OpenAI's); ``none`` and ``minimal`` turn thinking off."""


def has_thinking_switch(template: Any) -> bool:
    """Whether a chat template source has Qwen3's ``enable_thinking`` switch."""
    return isinstance(template, str) and THINKING_SWITCH in template


def decision_kwargs(template: Any, kwargs: Mapping[str, Any] | Sequence[tuple[str, Any]] = (),
                    ) -> dict[str, Any]:
    """The template variables a decision prompt renders with: the request's, plus thinking
    off where the template has a switch (unset, a thinking template would reason first and
    the label would not be the reply's first token)."""
    bound = dict(kwargs)
    if has_thinking_switch(template) and bound.get(THINKING_SWITCH) is None:
        bound[THINKING_SWITCH] = False
    return bound


def thinking_on(effort: str | None) -> bool | None:
    """``enable_thinking`` for a ``reasoning_effort`` (None: the request did not say)."""
    return None if effort is None else effort not in ("none", "minimal")


def split_reasoning(text: str, thinking: bool) -> tuple[str | None, str]:
    """``(reasoning, content)`` of a finished reply. With ``thinking`` on, or a reply that
    starts with ``<think>``, the text up to ``</think>`` is reasoning (an unfinished block:
    all of it); otherwise the reply is all content and reasoning is None."""
    splitter = ReasoningSplitter(thinking)
    parts = splitter.feed(text) + splitter.flush()
    reasoning = "".join(t for kind, t in parts if kind == "reasoning")
    content = "".join(t for kind, t in parts if kind == "content")
    return (reasoning if splitter.reasoned else None), content


class ReasoningSplitter:
    """Splits a streamed reply into ``("reasoning", text)`` and ``("content", text)`` pieces
    as it arrives; a tag split across deltas is held back until it is whole (or cannot be a
    tag). Whitespace right after ``</think>`` is dropped (Qwen3 writes ``</think>\\n\\n``)."""

    def __init__(self, thinking: bool):
        self.thinking = thinking
        self.state = "start"  # start -> reasoning -> content
        self.buffer = ""
        self.reasoned = False  # a reasoning block was found (possibly empty)

    def feed(self, text: str) -> list[tuple[str, str]]:
        self.buffer += text
        out: list[tuple[str, str]] = []
        while True:
            if self.state == "start":
                stripped = self.buffer.lstrip()
                if stripped.startswith(OPEN_TAG):
                    self.buffer = stripped[len(OPEN_TAG):]
                    self._enter_reasoning()
                elif stripped and OPEN_TAG.startswith(stripped):
                    return out  # maybe the opening tag: wait for more
                elif self.thinking and stripped:
                    self._enter_reasoning()
                elif stripped:
                    self.state = "content"
                else:
                    return out  # only whitespace yet
            elif self.state == "reasoning":
                end = self.buffer.find(CLOSE_TAG)
                if end >= 0:
                    if end:
                        out.append(("reasoning", self.buffer[:end]))
                    self.buffer = self.buffer[end + len(CLOSE_TAG):]
                    self.state = "after"
                    continue
                keep = _partial_tail(self.buffer, CLOSE_TAG)
                if len(self.buffer) > keep:
                    out.append(("reasoning", self.buffer[: len(self.buffer) - keep]))
                    self.buffer = self.buffer[len(self.buffer) - keep:]
                return out
            elif self.state == "after":
                self.buffer = self.buffer.lstrip()
                if not self.buffer:
                    return out
                self.state = "content"
            else:
                if self.buffer:
                    out.append(("content", self.buffer))
                    self.buffer = ""
                return out

    def _enter_reasoning(self) -> None:
        self.state = "reasoning"
        self.reasoned = True

    def flush(self) -> list[tuple[str, str]]:
        """What is held back at the end of the reply: a reasoning block never closed stays
        reasoning; text that only looked like the start of a tag is what it is."""
        text, self.buffer = self.buffer, ""
        if not text:
            return []
        if self.state == "reasoning":
            return [("reasoning", text)]
        if self.state == "start":
            if self.thinking and text.strip():
                self.reasoned = True
                return [("reasoning", text.lstrip())]
            self.state = "content"
        if self.state == "after":
            return []
        return [("content", text)]


def _partial_tail(text: str, tag: str) -> int:
    """The length of the longest end of ``text`` that begins ``tag`` (held back: the rest
    of the tag may come in the next delta)."""
    for n in range(min(len(tag) - 1, len(text)), 0, -1):
        if text.endswith(tag[:n]):
            return n
    return 0


def reasoning_token_count(ids: Sequence[int], decode: Callable[[Sequence[int]], str],
                          thinking: bool) -> int:
    """How many of a reply's generated ``ids`` belong to its reasoning: the fewest leading
    ids whose text holds the whole ``</think>`` (binary search: a handful of decodes), or
    all of them when the block never closed; 0 for a reply without reasoning."""
    if not ids:
        return 0
    text = decode(ids)
    reasoning, _ = split_reasoning(text, thinking)
    if reasoning is None:
        return 0
    if CLOSE_TAG not in text:
        return len(ids)
    low, high = 1, len(ids)  # the answer lies in [low, high]
    while low < high:
        mid = (low + high) // 2
        if CLOSE_TAG in decode(ids[:mid]):
            high = mid
        else:
            low = mid + 1
    return low


def parse_effort(value: Any, field: str) -> str | None:
    """A ``reasoning_effort`` value (chat) or ``reasoning.effort`` (Responses)."""
    if value is None:
        return None
    if not isinstance(value, str) or value not in EFFORTS:
        shown = repr(value[:40]) if isinstance(value, str) else _describe(value)
        raise ContractError(field, f"expected one of {', '.join(EFFORTS)}, got {shown}")
    return value


def generation_kwargs(template: Any, kwargs: Sequence[tuple[str, Any]], effort: str | None,
                      effort_field: str, *, accepts_kwargs: bool) -> dict[str, Any]:
    """The template variables a generation prompt renders with: the request's
    ``chat_template_kwargs`` and its reasoning effort mapped onto the template's thinking
    switch. A model without a switch cannot think, so an effort other than ``none`` is
    refused there (naming ``effort_field``), never silently ignored; a backend that renders
    no template variables refuses them by name."""
    bound = dict(kwargs)
    if effort is not None:
        on = thinking_on(effort)
        if has_thinking_switch(template) and accepts_kwargs:
            given = bound.get(THINKING_SWITCH)
            if given is not None and given != on:
                raise ContractError(effort_field, f"{effort!r} asks for thinking "
                                    f"{'on' if on else 'off'} but chat_template_kwargs."
                                    f"{THINKING_SWITCH} says {given!r}: send one of them")
            bound[THINKING_SWITCH] = on
        elif effort != "none" and has_thinking_switch(template):
            raise ContractError(effort_field, "reasoning is not supported by this model's "
                                "backend: it cannot set the template's thinking switch "
                                f"({THINKING_SWITCH}); send 'none' or leave the field out")
        elif effort != "none":
            raise ContractError(effort_field, "reasoning is not supported by this model: its "
                                f"chat template has no thinking switch ({THINKING_SWITCH}); "
                                "send 'none' or leave the field out")
    if bound and not accepts_kwargs:
        raise ContractError("chat_template_kwargs", "this model's backend renders no chat "
                            "template with arguments: send the request without it")
    return bound


def thinking_prompt(kwargs: Mapping[str, Any], prompt_text: str) -> bool:
    """Whether the reply starts inside a think block: thinking turned on, or a template that
    opens the block in the prompt itself (the reply then has no ``<think>`` of its own)."""
    return kwargs.get(THINKING_SWITCH) is True or prompt_text.rstrip().endswith(OPEN_TAG)
