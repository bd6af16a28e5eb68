"""Prompt rendering and label assignment: one pure function of (context, state, question).

A decision prompt is split in two:

* the **prefix** — chat head, system text (instructions + optional context) and the state —
  is the same for every question about a state, so it is computed once and cached;
* the **suffix** — the question, its labelled options and the chat tail — ends exactly where
  the answer label goes, so the next-token distribution at its last position is the answer.

Layout (inside the model's chat template, when it has one)::

    system: <SYSTEM_INSTRUCTIONS>[\\n\\nContext:\\n<context>]
    user:   <document>\\n<state>\\n</document>\\n\\n<question block>
    assistant: ▌  <- the label (A, B, …) is read here

The server, the CLI, the JSON-Schema decisions and the trainer all render through this module,
so the position the trainer optimises is byte-for-byte the position the server reads.
"""

from __future__ import annotations

import itertools
import json
import string
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

PROMPT_VERSION = "onepass-prompt-1"

SYSTEM_INSTRUCTIONS = (
    "You are a careful classifier. Read the document, then answer the question about it "
    "with the letter of the correct option only."
)

ZERO_WIDTH = "\u200b"


# --------------------------------------------------------------------------- content


def render_content(value: Any) -> str:
    """Text for a state, instruction or description: strings as-is, JSON canonically.

    JSON renders deterministically: keys in the order given, compact separators, non-ASCII
    kept as is. The same value always gives the same bytes.
    """
    if isinstance(value, str):
        return value.strip()
    return json.dumps(value, ensure_ascii=False, separators=(", ", ": "), allow_nan=False)


def neutralise(text: str, special_tokens: Sequence[str]) -> str:
    """Break every spelling of a special token inside user content.

    A zero-width space after the first character keeps the text readable while making sure
    the tokenizer can no longer produce the special token, so a state cannot close its turn,
    open an assistant turn or forge an answer.
    """
    for token in sorted(special_tokens, key=len, reverse=True):
        if len(token) > 1 and token in text:
            text = text.replace(token, token[0] + ZERO_WIDTH + token[1:])
    return text


# --------------------------------------------------------------------------- chat format


@dataclass(frozen=True)
class ChatFormat:
    """How a chat template wraps one system turn and one user turn, up to the answer.

    ``head + system + middle + user + tail`` is the rendered prompt. Templates without a
    system role carry the system text at the start of the user turn (``middle`` is then the
    separator inside that turn).
    """

    head: str
    middle: str
    tail: str

    @classmethod
    def from_template(cls, render: Callable[[list[dict[str, str]]], str]) -> ChatFormat:
        """Derive the format by rendering marker messages through the real template (a
        request's ``chat_template_kwargs`` are bound into ``render``)."""
        sys_mark, user_mark = "\x01ONEPASS_SYSTEM\x01", "\x01ONEPASS_USER\x01"
        try:
            text = render(
                [{"role": "system", "content": sys_mark}, {"role": "user", "content": user_mark}]
            )
            if sys_mark not in text:
                raise ValueError("system turn dropped")
        except Exception:  # template has no system role: fold system into the user turn
            text = render([{"role": "user", "content": sys_mark + "\n\n" + user_mark}])
        head, rest = text.split(sys_mark, 1)
        middle, tail = rest.split(user_mark, 1)
        return cls(head, middle, tail)


PLAIN_FORMAT = ChatFormat(head="", middle="\n\n", tail="\n\nAnswer:")
"""For base models without a chat template: labels are read after ``Answer:``."""


# --------------------------------------------------------------------------- labels

LETTERS = string.ascii_uppercase


def label_pool() -> Iterator[str]:
    """Label texts in order of preference: A–Z, then a–z, then AA, AB, … ZZ.

    Options take labels in declared order; a label that is not a single token in context is
    skipped (the next one in the pool takes its place), never merged.
    """
    yield from LETTERS
    yield from string.ascii_lowercase
    for a, b in itertools.product(LETTERS, repeat=2):
        yield a + b


@dataclass(frozen=True)
class Label:
    """A candidate answer label.

    ``text`` is shown in the option list (``A``); ``spelling`` is what follows the prompt when
    the model answers (``A`` after a newline, `` A`` after ``Answer:``); ``token_id`` is read.
    """

    text: str
    token_id: int
    spelling: str


class LabelError(ValueError):
    pass


def assign_labels(
    count: int,
    token_for: Callable[[str], tuple[int, str] | None],
    exclude: set[int] = frozenset(),
    pool: Iterable[str] | None = None,
) -> list[Label]:
    """Give ``count`` options distinct single-token labels, in declared order.

    ``token_for(text)`` returns ``(token_id, spelling)`` when the label, typed right after the
    prompt, tokenizes as exactly one extra token (prompt + label == prompt tokens + [id]),
    else None. Token ids in ``exclude`` are skipped.
    """
    labels: list[Label] = []
    seen: set[int] = set(exclude)
    for text in label_pool() if pool is None else pool:
        if len(labels) == count:
            break
        found = token_for(text)
        if found is None or found[0] in seen:
            continue
        seen.add(found[0])
        labels.append(Label(text, found[0], found[1]))
    if len(labels) < count:
        raise LabelError(
            f"the tokenizer offers only {len(labels)} usable single-token labels; "
            f"{count} are needed"
        )
    return labels


# --------------------------------------------------------------------------- questions


@dataclass(frozen=True)
class Style:
    """Prompt choices measured by ``benchmarks/prompt_formats.py``; the default ships.

    ``noul_words``: a noul is read from the ``Yes``/``No`` tokens instead of ``A``/``B``.
    ``score_digits``: score levels are labelled ``0``…``9`` instead of ``A``, ``B``, ….
    ``option_names``: a choice option shows its name before its description.
    ``lead``: text that opens the answer turn, after the chat header (e.g. ``Answer:``).
    """

    noul_words: bool = False
    score_digits: bool = False
    option_names: bool = True
    lead: str = ""


DEFAULT_STYLE = Style()
NOUL_WORDS = ("Yes", "No")


def label_texts(qtype: str, count: int, style: Style = DEFAULT_STYLE) -> Iterator[str]:
    """The label pool for a question type under ``style``."""
    if qtype == "noul" and style.noul_words:
        return iter(NOUL_WORDS)
    if qtype == "score" and style.score_digits:
        return iter(string.digits[:count])
    return label_pool()


def _option_line(label: str, name: str | None, description: Any, special: Sequence[str]) -> str:
    parts = [neutralise(name, special)] if name else []
    if description is not None:
        parts.append(neutralise(render_content(description), special))
    return f"{label}) " + ": ".join(parts)


def render_question(
    qtype: str,
    instructions: Any,
    options: Sequence[str],
    descriptions: Sequence[Any],
    labels: Sequence[str],
    special_tokens: Sequence[str] = (),
    style: Style = DEFAULT_STYLE,
) -> str:
    """The question block: instructions, labelled options, and the answer request."""
    text = neutralise(render_content(instructions), special_tokens) if instructions else ""
    if qtype == "noul":
        lines = [f"Statement: {text}" if text else "Statement:", "Is the statement true?"]
        if tuple(labels) == NOUL_WORDS:
            lines += [
                f"{label} means: {neutralise(render_content(desc), special_tokens)}"
                for label, desc in zip(labels, descriptions)
                if desc is not None
            ]
        else:
            for label, name, desc in zip(labels, NOUL_WORDS, descriptions):
                lines.append(_option_line(label, name, desc, special_tokens))
    elif qtype == "choice":
        lines = [f"Question: {text}", "Options:"]
        for label, name, desc in zip(labels, options, descriptions):
            shown = name if style.option_names or desc is None else None
            lines.append(_option_line(label, shown, desc, special_tokens))
    elif qtype == "score":
        lines = [f"Question: {text}", "Levels, from lowest to highest:"]
        for label, desc in zip(labels, descriptions):
            lines.append(_option_line(label, None, desc, special_tokens))
    else:
        raise ValueError(f"unknown question type {qtype!r}")
    shown = ", ".join(labels[:-1]) + f" or {labels[-1]}" if len(labels) > 1 else labels[0]
    lines.append(f"Answer with {shown}.")
    return "\n".join(lines)


# --------------------------------------------------------------------------- whole prompt


def system_text(context: str | None = None, special_tokens: Sequence[str] = (),
                instructions: str | None = None) -> str:
    """The system turn: onepass's instructions, the server's context, then a request's own
    ``instructions`` (System One's vLLM field), each neutralised like user content."""
    text = SYSTEM_INSTRUCTIONS
    if context and context.strip():
        text += f"\n\nContext:\n{neutralise(context.strip(), special_tokens)}"
    if instructions and instructions.strip():
        text += f"\n\nInstructions:\n{neutralise(instructions.strip(), special_tokens)}"
    return text


def render_prefix(
    fmt: ChatFormat, state: Any, context: str | None = None, special_tokens: Sequence[str] = (),
    instructions: str | None = None,
) -> str:
    """Everything before the question: shared by all questions about ``state``."""
    body = neutralise(render_content(state), special_tokens)
    return (
        fmt.head
        + system_text(context, special_tokens, instructions)
        + fmt.middle
        + f"<document>\n{body}\n</document>"
    )


def render_suffix(fmt: ChatFormat, question_block: str, style: Style = DEFAULT_STYLE) -> str:
    """The question and the chat tail; the prompt ends where the label goes."""
    return "\n\n" + question_block + fmt.tail + style.lead
