"""Grammar-constrained decoding: the one module that knows the grammar engine (llguidance).

A JSON Schema, "any JSON object" or a Lark/GBNF grammar is compiled once per backend
vocabulary (LRU-cached by its canonical text) into a :class:`Grammar`; each sequence gets its
own :class:`Matcher`, which hands the sampler a boolean token mask and is told every drawn
token. The sampler sees only the mask, never the engine.

Nothing is loosened: llguidance refuses what it cannot enforce (``uniqueItems``, ``not``,
``if``/``then``, ``contains``, ``propertyNames``, ``dependentRequired``/``dependentSchemas``,
``unevaluated*``, remote ``$ref``, a ``oneOf`` it cannot prove equal to ``anyOf``, unknown
``format``s, look-around or back-references in ``pattern``), and its ``lenient`` and
``coerce_one_of`` switches are forced off even when a schema's own ``x-guidance`` asks for
them; every refusal is a :class:`~onepass.contract.ContractError` naming the field and the
construct. JSON is generated compact (no whitespace between tokens: a small model given free
whitespace can spend its whole budget on newlines), with properties in declaration order.
"""

from __future__ import annotations

import json
import re
import threading
import warnings
import weakref
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch

from onepass.contract import ContractError, _describe

ENGINE = "llguidance"
CACHE_ENTRIES = 128
_JSON_DEFAULTS = {"whitespace_flexible": False}
_JSON_STRICT = {"lenient": False, "coerce_one_of": False}  # applied after a schema's x-guidance
_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")
_SCHEMA_KEYS = {"name", "schema", "strict", "description"}


class GrammarError(RuntimeError):
    """The matcher cannot go on (no allowed token, or a token it refused): a sequence fault."""


# --------------------------------------------------------------------------- the vocabulary


class TokenizerInfo:
    """The grammar engine's view of one backend's vocabulary (about 0.3 s to build: once).

    ``vocab_size`` is the logits row length (it may exceed the tokenizer's own size); the
    EOS ids are the backend's, so a grammar may end on any of them, and only when complete.
    """

    def __init__(self, tokenizer: Any, vocab_size: int, eos_ids: Any, *,
                 llama_vocab: Any = None):
        self.vocab_size = int(vocab_size)
        self.eos_ids = frozenset(int(t) for t in eos_ids)
        eos = sorted(self.eos_ids) or None
        if llama_vocab is not None:  # a llama.cpp model: its own vocabulary and tokenizer
            import llguidance.llamacpp

            with warnings.catch_warnings():  # one deprecation warning per token otherwise
                warnings.simplefilter("ignore", DeprecationWarning)
                self.engine = llguidance.llamacpp.lltokenizer_from_vocab(
                    llama_vocab, n_vocab=self.vocab_size, eos_token=eos
                )
        else:
            import llguidance.hf

            self.engine = llguidance.hf.from_tokenizer(
                tokenizer, n_vocab=self.vocab_size, eos_token=eos
            )

    def token_ids(self, text: str) -> list[int]:
        """``text`` in the grammar engine's tokenization (to advance a matcher past text the
        prompt already holds, such as the opening quote of a JSON string)."""
        return list(self.engine.tokenize_str(text))


_INFOS: weakref.WeakKeyDictionary[Any, TokenizerInfo] = weakref.WeakKeyDictionary()
_INFO_LOCK = threading.Lock()


def tokenizer_info(backend: Any) -> TokenizerInfo:
    """The backend's :class:`TokenizerInfo`, built on first use and kept with the backend
    (a llama.cpp backend hands over its vocabulary as ``llama_vocab``, a torch backend its
    Hugging Face ``tokenizer``)."""
    with _INFO_LOCK:
        info = _INFOS.get(backend)
        if info is None:
            info = TokenizerInfo(getattr(backend, "tokenizer", None), backend.vocab_size,
                                 backend.eos_ids, llama_vocab=getattr(backend, "llama_vocab", None))
            _INFOS[backend] = info
        return info


# --------------------------------------------------------------------------- compiled grammars


class Grammar:
    """One compiled grammar for one vocabulary; shared by every sequence that uses it."""

    def __init__(self, info: TokenizerInfo, kind: str, source: str, template: Any):
        self.info = info
        self.kind = kind  # json_schema | json_object | grammar
        self.source = source
        self._template = template  # a matcher at the start state, only ever copied
        self._lock = threading.Lock()

    def matcher(self) -> Matcher:
        """A fresh matcher at the start of the grammar, for one sequence."""
        with self._lock:
            return Matcher(self._template.deep_copy(), self.info)


class Matcher:
    """One sequence's position in its grammar: the mask for the next token, then the token."""

    def __init__(self, engine: Any, info: TokenizerInfo):
        self._engine = engine
        self.info = info
        words = (info.vocab_size + 31) // 32
        self._words = torch.zeros(words, dtype=torch.int32)

    def allowed_mask(self, vocab_size: int | None = None,
                     device: torch.device | str = "cpu") -> torch.Tensor:
        """Boolean row of ``vocab_size`` (default: the vocabulary): True where the grammar
        allows the next token. EOS is allowed only where the grammar may end."""
        n = self.info.vocab_size if vocab_size is None else vocab_size
        self._engine.unsafe_compute_mask_ptr(self._words.data_ptr(), self._words.numel() * 4)
        if self._engine.is_error():
            raise GrammarError(f"grammar matcher failed: {self._engine.get_error()}")
        if not bool(self._words.any()):
            raise GrammarError("the grammar allows no next token")
        words = self._words.to(device, non_blocking=True)
        bits = (words.unsqueeze(1) >> _shifts(words.device)) & 1
        mask = bits.flatten()[: min(n, self.info.vocab_size)].bool()
        if n > mask.numel():  # rows past the vocabulary are never allowed
            mask = torch.cat([mask, mask.new_zeros(n - mask.numel())])
        return mask

    def argmax(self, logits: Any) -> int:
        """The first highest logit among the tokens allowed next (greedy under the grammar):
        disallowed rows are -inf, so an end token wins only where the grammar may end.
        ``logits``: one row, a tensor or a numpy array (llama.cpp's, read in place)."""
        logits = torch.as_tensor(logits)
        mask = self.allowed_mask(logits.shape[-1], device=logits.device)
        return int(torch.argmax(logits.float().masked_fill(~mask, float("-inf"))))

    def accept(self, token: int) -> None:
        """Advance past a drawn token; a token the grammar refuses is a :class:`GrammarError`."""
        if not self._engine.consume_token(int(token)):
            raise GrammarError(
                f"the grammar refused token {token}: {self._engine.get_error() or 'not allowed'}"
            )

    def is_accepting(self) -> bool:
        """The text so far is a complete sentence of the grammar (EOS would be allowed)."""
        return bool(self._engine.is_accepting())

    @property
    def done(self) -> bool:
        """Complete and nothing may follow: the sequence ends here."""
        return bool(self._engine.is_stopped())


_SHIFT_CACHE: dict[str, torch.Tensor] = {}


def _shifts(device: torch.device) -> torch.Tensor:
    key = str(device)
    if key not in _SHIFT_CACHE:
        _SHIFT_CACHE[key] = torch.arange(32, dtype=torch.int32, device=device)
    return _SHIFT_CACHE[key]


_CACHE: OrderedDict[tuple[Any, str, str], Grammar] = OrderedDict()
_CACHE_LOCK = threading.Lock()


def compile_grammar(
    info: TokenizerInfo,
    *,
    json_schema: Mapping[str, Any] | None = None,
    json_object: bool = False,
    grammar: str | None = None,
    field: str = "response_format",
) -> Grammar:
    """Compile exactly one of a JSON Schema (an object), any JSON object, or a Lark/GBNF
    grammar for ``info``'s vocabulary; cached by canonical text. A construct the engine
    cannot enforce raises :class:`ContractError` naming ``field`` and the construct."""
    given = (json_schema is not None) + bool(json_object) + (grammar is not None)
    if given != 1:
        raise ValueError("compile_grammar takes exactly one of json_schema, json_object, grammar")
    if grammar is not None:
        if not isinstance(grammar, str) or not grammar.strip():
            raise ContractError(field, f"expected a non-empty Lark or GBNF grammar, got "
                                f"{_describe(grammar)}")
        kind, source = "grammar", grammar
    elif json_object:
        kind, source = "json_object", '{"type":"object"}'
    else:
        if not isinstance(json_schema, Mapping):
            raise ContractError(field, f"expected a JSON Schema object, got "
                                f"{_describe(json_schema)}")
        kind, source = "json_schema", _canonical(json_schema, field)
    key = (info, kind, source)
    with _CACHE_LOCK:
        found = _CACHE.get(key)
        if found is not None:
            _CACHE.move_to_end(key)
            return found
    compiled = _compile(info, kind, source, field)
    with _CACHE_LOCK:
        _CACHE[key] = compiled
        _CACHE.move_to_end(key)
        while len(_CACHE) > CACHE_ENTRIES:
            _CACHE.popitem(last=False)
    return compiled


def _canonical(schema: Mapping[str, Any], field: str) -> str:
    """Compact JSON text in the schema's own key order (property order is generation order)."""
    try:
        return json.dumps(schema, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise ContractError(field, f"the schema is not JSON: {exc}") from None


def _compile(info: TokenizerInfo, kind: str, source: str, field: str) -> Grammar:
    import llguidance

    try:
        if kind == "grammar":
            text = llguidance.grammar_from("grammar", source)  # Lark, or GBNF converted to Lark
        else:
            text = llguidance.LLMatcher.grammar_from_json_schema(
                source, defaults=_JSON_DEFAULTS, overrides=_JSON_STRICT
            )
    except ValueError as exc:
        raise ContractError(field, _refusal(kind, str(exc))) from None
    is_error, messages = llguidance.LLMatcher.validate_grammar_with_warnings(text, info.engine)
    if is_error or messages:  # a warning is a construct the engine would treat loosely
        raise ContractError(field, _refusal(kind, "; ".join(messages) or "invalid"))
    template = llguidance.LLMatcher(info.engine, text, log_level=0)
    if template.is_error():
        raise ContractError(field, _refusal(kind, template.get_error()))
    return Grammar(info, kind, source, template)


def _refusal(kind: str, message: str) -> str:
    message = " ".join(message.split())
    if len(message) > 400:
        message = message[:400] + "..."
    if kind == "grammar":
        return f"the grammar (Lark or GBNF) is invalid or cannot be enforced ({ENGINE}): {message}"
    return f"the JSON Schema cannot be enforced while generating ({ENGINE}): {message}"


# --------------------------------------------------------------------------- request shapes


@dataclass(frozen=True)
class GrammarSpec:
    """What a request asked to constrain, parsed and validated without a model.

    Exactly one of ``json_schema``, ``json_object`` or ``grammar`` is set; ``field`` is where
    it came from, for the refusal a compilation may still raise; ``name`` is the schema name.
    """

    json_schema: Mapping[str, Any] | None = None
    json_object: bool = False
    grammar: str | None = None
    field: str = "response_format"
    name: str | None = None

    def compile(self, info: TokenizerInfo) -> Grammar:
        return compile_grammar(info, json_schema=self.json_schema, json_object=self.json_object,
                               grammar=self.grammar, field=self.field)


def grammar_from_response_format(raw: Any, field: str = "response_format") -> GrammarSpec | None:
    """Parse an OpenAI ``response_format`` (None or ``{"type": "text"}``: unconstrained).

    Shapes: ``{"type": "json_object"}``; chat completions' ``{"type": "json_schema",
    "json_schema": {"name", "schema", "strict", "description"}}``; and the Responses API's
    ``text.format``, the same keys beside ``type``. ``name`` is optional here (OpenAI's
    pattern when given); ``strict`` must be a boolean when given, and the schema is enforced
    either way. Unknown keys are refused, not ignored.
    """
    if raw is None:
        return None
    if not isinstance(raw, Mapping):
        raise ContractError(field, f"expected an object, got {_describe(raw)}")
    kind = raw.get("type")
    if kind in ("text", "json_object"):
        _no_extra(raw, {"type"}, field)
        return None if kind == "text" else GrammarSpec(json_object=True, field=field)
    if kind != "json_schema":
        raise ContractError(f"{field}.type", "expected one of text, json_object, json_schema, "
                            f"got {_describe(kind)}")
    if "json_schema" in raw:
        _no_extra(raw, {"type", "json_schema"}, field)
        body, where = raw["json_schema"], f"{field}.json_schema"
        if not isinstance(body, Mapping):
            raise ContractError(where, f"expected an object, got {_describe(body)}")
        _no_extra(body, _SCHEMA_KEYS, where)
    else:
        body, where = raw, field
        _no_extra(body, _SCHEMA_KEYS | {"type"}, where)
    name = body.get("name")
    if name is not None and not (isinstance(name, str) and _NAME.fullmatch(name)):
        raise ContractError(f"{where}.name", "expected 1 to 64 letters, digits, '_' or '-', "
                            f"got {_describe(name)}")
    strict = body.get("strict")
    if strict is not None and not isinstance(strict, bool):
        raise ContractError(f"{where}.strict", f"expected a boolean, got {_describe(strict)}")
    description = body.get("description")
    if description is not None and not isinstance(description, str):
        raise ContractError(f"{where}.description",
                            f"expected a string, got {_describe(description)}")
    if "schema" not in body:
        raise ContractError(f"{where}.schema", "a json_schema response format needs a schema")
    schema = body["schema"]
    if not isinstance(schema, Mapping):
        raise ContractError(f"{where}.schema", f"expected a JSON Schema object, got "
                            f"{_describe(schema)}")
    return GrammarSpec(json_schema=schema, field=f"{where}.schema", name=name)


def grammar_request(
    response_format: Any = None, grammar: Any = None, *,
    format_field: str = "response_format", grammar_field: str = "grammar",
) -> GrammarSpec | None:
    """The one grammar of a request: a non-text ``response_format`` or a ``grammar`` string
    (Lark or GBNF); both at once is refused, never resolved by precedence."""
    spec = grammar_from_response_format(response_format, format_field)
    if grammar is None:
        return spec
    if spec is not None:
        raise ContractError(grammar_field, f"a grammar and a {format_field} other than text "
                            "cannot be combined: send one of them")
    if not isinstance(grammar, str) or not grammar.strip():
        raise ContractError(grammar_field, f"expected a non-empty Lark or GBNF grammar, got "
                            f"{_describe(grammar)}")
    return GrammarSpec(grammar=grammar, field=grammar_field)


def _no_extra(raw: Mapping[str, Any], allowed: set[str], field: str) -> None:
    extra = sorted(str(k) for k in raw if k not in allowed)
    if extra:
        raise ContractError(field, f"unknown key(s) {', '.join(extra)}; expected only "
                            f"{', '.join(sorted(allowed))}")
