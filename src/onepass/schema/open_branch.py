"""The open branch: the value of an open field whose escape won, generated greedily after its
label, either free (a string stopped at its closing quote and cut at ``maxLength``) or under the
field's grammar (llguidance, compiled for the engine's vocabulary by
:func:`compile_constraints` when the plan is made).

Apart from the runner (:mod:`onepass.schema.decide`) because it is the one part that generates
text and the one user of the grammar engine (imported lazily, so importing it loads no torch).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from onepass.contract import ContractError
from onepass.schema.fields import SchemaField, _field_error

if TYPE_CHECKING:
    from onepass.engine import DecisionEngine


def _string_end(text: str) -> int | None:
    """Index where a JSON string body ends (unescaped quote or raw control char), else None."""
    escaped = False
    for i, ch in enumerate(text):
        if escaped:
            escaped = False
        elif ch == "\\":
            escaped = True
        elif ch == '"' or ord(ch) < 0x20:
            return i
    return None


_ESCAPES = {'"': '"', "\\": "\\", "/": "/", "b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t"}


def read_json_string(body: str, max_length: int | None = None) -> str:
    """Decode a generated JSON string body (possibly cut by the bound) into a valid string.

    A dangling or invalid escape is dropped, lone surrogates and a trailing partial character
    are removed, and the result is cut to ``max_length`` characters.
    """
    end = _string_end(body)
    body = body if end is None else body[:end]
    out: list[str] = []
    i = 0
    while i < len(body):
        ch = body[i]
        if ch != "\\":
            out.append(ch)
            i += 1
            continue
        nxt = body[i + 1 : i + 2]
        if nxt in _ESCAPES:
            out.append(_ESCAPES[nxt])
            i += 2
        elif nxt == "u" and len(body) >= i + 6 and all(
            c in "0123456789abcdefABCDEF" for c in body[i + 2 : i + 6]
        ):
            out.append(chr(int(body[i + 2 : i + 6], 16)))
            i += 6
        else:  # invalid or cut-off escape: drop the backslash
            i += 1
    text = "".join(out)
    text = text.encode("utf-16", "surrogatepass").decode("utf-16", "ignore")
    text = "".join(c for c in text if not 0xD800 <= ord(c) <= 0xDFFF).rstrip("\ufffd")
    return text if max_length is None else text[:max_length]


def _generate_string(
    engine: DecisionEngine, tokens: list[int], lead: str, max_tokens: int,
    max_length: int | None, expired: Callable[[], bool],
) -> tuple[str, int, int, int]:
    """Open the record's string (after ``lead``) and generate to its closing quote, a bound,
    or ``expired()`` (checked after every token).

    Returns ``(value, prompt tokens, cached prompt tokens, generated tokens)``.
    """
    backend = engine.backend
    prompt = tokens + backend.encode(lead + '"', bos=False)

    def closed(ids: list[int]) -> bool:
        text = backend.decode(ids)
        return expired() or _string_end(text) is not None or (
            max_length is not None and len(read_json_string(text)) > max_length
        )

    ids, cached = engine.continuation(prompt, max_tokens, stop=closed)
    return read_json_string(backend.decode(ids), max_length), len(prompt), cached, len(ids)


def compile_constraints(engine: DecisionEngine, fields: Sequence[SchemaField]) -> dict[str, Any]:
    """The grammar of every constrained open field, by path, compiled for the engine's
    vocabulary before any model work (cached per vocabulary by the grammar module).

    A construct the grammar engine cannot enforce is a :class:`ContractError` naming the field
    and the keyword (an unknown ``format``, look-around in ``pattern``, ...), never loosened.
    """
    constrained = [f for f in fields if f.open and f.constrained]
    if not constrained:
        return {}
    from onepass.generate.grammar import compile_grammar, tokenizer_info

    info = tokenizer_info(engine.backend)
    out: dict[str, Any] = {}
    for f in constrained:
        spec = json.loads(f.constraint or "{}")
        try:
            grammar = compile_grammar(info, json_schema=spec, field=f.path)
        except ContractError as exc:
            raise _field_error(f.keys, f"{_culprit(info, spec)} cannot be enforced while "
                               f"generating: {exc.message}") from None
        for value in f.values:  # declared values obey the constraints too (linear: a DFA)
            if f.value_type == "integer" and isinstance(value, float):
                value = int(value)  # 1.0 is the integer 1 (the type check admitted it)
            if not _grammar_admits(grammar, value):
                raise _field_error(f.keys, f"declared value {value!r} does not satisfy the "
                                   f"field's constraints {f.constraint}")
        out[f.path] = grammar
    return out


def _grammar_admits(grammar: Any, value: Any) -> bool:
    """Whether ``value``'s JSON text is a complete sentence of ``grammar``."""
    from onepass.generate.grammar import GrammarError

    matcher = grammar.matcher()
    try:
        for token in grammar.info.token_ids(json.dumps(value, ensure_ascii=False)):
            matcher.accept(token)
    except GrammarError:
        return False
    return matcher.is_accepting()


def _culprit(info: Any, spec: Mapping[str, Any]) -> str:
    """The keyword of a refused constraint (each compiled alone), for the error message."""
    from onepass.generate.grammar import compile_grammar

    keys = [k for k in spec if k != "type"]
    for key in keys:
        try:
            compile_grammar(info, json_schema={"type": spec["type"], key: spec[key]})
        except ContractError:
            return f"'{key}': {json.dumps(spec[key], ensure_ascii=False)}"
    return "the combination of " + ", ".join(f"'{k}'" for k in keys)


def _generate_value(
    engine: DecisionEngine, f: SchemaField, grammar: Any, tokens: list[int], lead: str,
    max_tokens: int, expired: Callable[[], bool],
) -> tuple[Any, bool, int, int, int]:
    """Generate an open value under its grammar, greedily (the argmax of allowed tokens).

    A string's prompt ends with ``lead + '"'`` exactly as on the unconstrained branch (the
    matcher is advanced past that quote); a number's ends before ``lead``, which the grammar
    then requires, so the model spells `` 42`` its own way. Returns ``(value, complete,
    prompt tokens, cached prompt tokens, generated tokens)``; ``complete`` is False when the
    bound or ``expired()`` stopped it before the grammar was satisfied (value None).
    """
    from onepass.generate.grammar import compile_grammar

    backend = engine.backend
    info = grammar.info
    if f.value_type == "string":
        prompt = tokens + backend.encode(lead + '"', bos=False)
        matcher = grammar.matcher()
        for token in info.token_ids('"'):
            matcher.accept(token)
        opener = '"'
    else:
        prompt = list(tokens)
        if lead:  # the lead the record writes back (`` 42`` after ``Answer:``), then the value
            grammar = compile_grammar(
                info, grammar=f"start: {json.dumps(lead)} value\nvalue: %json {f.constraint}",
                field=f.path,
            )
        matcher = grammar.matcher()
        opener = ""
    ids, cached = engine.continuation(prompt, max_tokens, stop=lambda _ids: expired(),
                                      matcher=matcher)
    complete = matcher.done or (len(ids) < max_tokens and matcher.is_accepting()
                                and not expired())
    value = None
    if complete:
        value = json.loads(opener + bytes(info.engine.decode_bytes(ids)).decode("utf-8"))
        if f.value_type == "integer" and isinstance(value, float):
            value = int(value)
    return value, complete, len(prompt), cached, len(ids)

