"""Every size limit a request can pass, refused with one wording and one status per kind (pure).

Each route checks its lengths and counts through these functions, so a client reads the same
sentence, and gets the same status, whichever route it called. The server maps ``kind`` to a
status through :data:`onepass.server.errors.STATUS_BY_KIND`:

* a prompt over a token limit (``max_input_tokens``, the model's context, an encoder's
  sequence limit, a request's total): ``max_tokens_exceeded``, 413. Nothing is truncated.
* more items than a request may carry (questions, schema fields): ``too_many_questions``, 413.
* a request body over ``max_body_bytes`` (as sent, or once decoded): ``request_too_large``, 413.
* an output bound the prompt leaves no room for: ``invalid_request_error``, 400 (the request's
  own numbers disagree); generated tokens over a per-request budget: ``max_tokens_exceeded``.
* a token id the model does not have: ``invalid_request_error``, 400.
"""

from __future__ import annotations

from collections.abc import Iterable

from onepass.contract import ContractError

TOO_LONG = "max_tokens_exceeded"
TOO_MANY = "too_many_questions"
TOO_LARGE = "request_too_large"

MAX_INPUT_TOKENS = "max_input_tokens"
CONTEXT = "the model's context"
ENCODER_LIMIT = "the embedding model's sequence limit"


def too_long(
    field: str,
    tokens: int | str,
    limit: int,
    setting: str = MAX_INPUT_TOKENS,
    *,
    what: str = "the prompt",
    when: str = "",
    advice: str = "shorten the input or raise the limit",
) -> ContractError:
    """``what`` has ``tokens`` tokens, over ``limit`` (named by ``setting``): a 413.

    ``tokens`` may be a lower bound written as text ("at least 9000"), for a prompt refused
    before it was tokenized. ``advice`` says what the client can do instead."""
    return ContractError(
        field,
        f"{what} has {tokens} tokens{when}, over the limit of {limit} ({setting}); "
        f"nothing is truncated: {advice}",
        kind=TOO_LONG,
    )


def check_tokens(
    field: str,
    tokens: int,
    *,
    max_input_tokens: int,
    context: int | None = None,
    what: str = "the prompt",
) -> None:
    """Refuse a prompt of ``tokens`` tokens over ``max_input_tokens`` or the model's context."""
    if tokens > max_input_tokens:
        raise too_long(field, tokens, max_input_tokens, what=what)
    if context is not None and tokens > context:
        raise too_long(field, tokens, context, CONTEXT, what=what,
                       advice="shorten the input or use a model with a longer context")


def too_many(
    field: str,
    count: int,
    noun: str,
    limit: int,
    setting: str,
    *,
    advice: str = "split the request",
) -> ContractError:
    """``count`` ``noun`` over the per-request ``limit`` (named by ``setting``): a 413."""
    return ContractError(
        field,
        f"{count} {noun} is over the limit of {limit} per request ({setting}); {advice}",
        kind=TOO_MANY,
    )


def check_vocabulary(field: str, token_ids: Iterable[int], vocab_size: int) -> None:
    """Refuse the first token id the model does not have (ids run 0..vocab_size-1): a 400."""
    bad = next((t for t in token_ids if not 0 <= t < vocab_size), None)
    if bad is not None:
        raise ContractError(
            field, f"token id {bad} is outside the vocabulary (ids 0..{vocab_size - 1})"
        )


def body_too_large(limit: int, what: str = "request body") -> ContractError:
    """A body (``what``: as sent, or decoded) over ``max_body_bytes``: a 413."""
    return ContractError(
        "",
        f"the {what} is over the limit of {limit} bytes (max_body_bytes); "
        "nothing is truncated: send a smaller request or raise the limit",
        kind=TOO_LARGE,
    )


def output_room(
    prompt_tokens: int,
    context: int,
    requested: int | None = None,
    *,
    field: str = "max_tokens",
    prompt_field: str = "messages",
) -> int:
    """The output tokens the context leaves after a prompt: refuses a prompt that leaves none
    and a ``requested`` bound that does not fit (400s: the request's own numbers disagree)."""
    room = context - prompt_tokens
    if room < 1:
        raise ContractError(
            prompt_field,
            f"the prompt has {prompt_tokens} tokens and leaves no room for an output token in "
            f"the {context}-token context",
        )
    if requested is not None and requested > room:
        raise ContractError(
            field,
            f"{requested} output tokens do not fit: the prompt has {prompt_tokens} tokens and "
            f"the context {context}, so at most {room}",
        )
    return room


def too_much_output(field: str, what: str, tokens: int, limit: int, advice: str) -> ContractError:
    """``what`` may generate ``tokens`` tokens, over a per-request budget of ``limit``: a 413."""
    return ContractError(
        field,
        f"{what} may generate {tokens} tokens, over the limit of {limit} per request: {advice}",
        kind=TOO_LONG,
    )
