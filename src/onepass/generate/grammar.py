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

A request's grammar is hostile input to native code: llguidance's compilers recurse, and a
deep enough grammar overflows the stack and kills the process (measured on an 8 MiB stack: a
chain of ~920 object ``$ref`` links, ~2,700 chained Lark rules, ~5,000 nested objects). So
every grammar is bounded first (:data:`LIMITS`: size, schema depth counting each ``$ref``
hop, rule count; one refusal wording, naming the field), then compiled on a thread of its own
with a large stack (:data:`COMPILE_STACK_BYTES`, where everything under the bounds fits a
hundred times over), and probed: its first tokens are walked on a copy, so a grammar the
parser cannot follow (llguidance's 2,000-item row limit) is a refusal at compile time, not a
fault in the step loop.

Size: everything that touches llguidance, kept in one module so that its API lives in exactly
one place (compiling, bounding, probing, the per-sequence matcher).
"""

from __future__ import annotations

import json
import os
import queue
import re
import threading
import warnings
import weakref
from collections import OrderedDict
from collections.abc import Mapping
from concurrent.futures import Future
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote

from onepass.contract import ContractError, _describe

if TYPE_CHECKING:  # torch is imported where a mask is built: the server's request models
    import torch  # compile grammars through this module without loading torch

ENGINE = "llguidance"
CACHE_ENTRIES = 128
_JSON_DEFAULTS = {"whitespace_flexible": False}
_JSON_STRICT = {"lenient": False, "coerce_one_of": False}  # applied after a schema's x-guidance
_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")
_SCHEMA_KEYS = {"name", "schema", "strict", "description"}


class GrammarError(RuntimeError):
    """The matcher cannot go on (no allowed token, a token it refused, or a parser limit met
    mid-sequence): a fault of that one sequence's grammar, reported against ``field``."""

    def __init__(self, message: str, field: str | None = None):
        super().__init__(message)
        self.field = field


# --------------------------------------------------------------------------- bounds


@dataclass(frozen=True)
class GrammarLimits:
    """What a request's grammar may be before it reaches llguidance (checked in Python,
    without recursion past the bounds). Measured native crash points on an 8 MiB stack: ~920
    chained object ``$ref`` links (3 depth units each here: the bound admits ~42) and ~2,700
    chained Lark rules (the bound admits 1,000), so even a plain 8 MiB stack holds 2.7 times
    what the bounds admit; the compile thread's stack is 32 times that, and compiled 3,400
    links and 18,000 rules (both past ``max_chars``, which bounds what any shape can cost)."""

    max_chars: int = 262_144  # the schema's compact JSON text, or the grammar's text
    max_depth: int = 128  # nested schema objects/arrays along a path, plus one per $ref hop
    max_rules: int = 1_000  # rule and terminal definitions of a Lark/GBNF grammar
    probe_tokens: int = 8  # tokens walked at compile time (first allowed token each step)


LIMITS = GrammarLimits()
COMPILE_STACK_BYTES = 256 * 2**20  # virtual: only the pages a compile touches are committed


def _too_big(field: str, what: str) -> ContractError:
    """The one wording of every bound's refusal."""
    return ContractError(field, f"the grammar is too large or too deep to compile safely: "
                         f"{what}; simplify it (limits: {LIMITS.max_chars:,} characters, "
                         f"depth {LIMITS.max_depth} counting each $ref, "
                         f"{LIMITS.max_rules:,} grammar rules)")


def check_schema_bounds(schema: Any, field: str, limits: GrammarLimits = LIMITS) -> None:
    """Refuse a JSON Schema longer than ``limits.max_chars`` (compact JSON) or deeper than
    ``limits.max_depth``: each nested object or array is one level, and each ``$ref`` (a
    local ``#...``, an ``$id`` in the document, or an ``$anchor``) one more plus its target's
    depth (each target measured once; a cycle counts once, as the compiler makes it one
    rule). Never recurses past the bound."""
    resources: dict[str, Any] = {}
    _index_resources(schema, resources)
    heights: dict[int, int] = {}  # id(target) -> its measured height
    open_targets: set[int] = set()

    def height(node: Any, depth: int, base: Any) -> int:
        if depth > limits.max_depth:
            raise _too_big(field, f"nested deeper than {limits.max_depth} levels")
        if isinstance(node, list):
            return 1 + max((height(x, depth + 1, base) for x in node), default=0)
        if not isinstance(node, Mapping):
            return 0
        if isinstance(node.get("$id"), str):
            base = node
        best = 0
        ref = node.get("$ref")
        if isinstance(ref, str):
            target, target_base = _resolve(ref, base, resources)
            if target is not None and id(target) not in open_targets:
                key = id(target)
                if key not in heights:
                    open_targets.add(key)
                    heights[key] = height(target, depth + 1, target_base)
                    open_targets.discard(key)
                best = 1 + heights[key]
                if depth + best > limits.max_depth:
                    raise _too_big(field, f"nested deeper than {limits.max_depth} levels")
        for value in node.values():
            if isinstance(value, (Mapping, list)):
                best = max(best, 1 + height(value, depth + 1, base))
        return best

    height(schema, 0, schema)
    try:
        size = len(json.dumps(schema, separators=(",", ":"), ensure_ascii=False))
    except (TypeError, ValueError):
        return  # not JSON: refused where it is read (the compiler, the validator)
    if size > limits.max_chars:
        raise _too_big(field, f"{size:,} characters")


def _index_resources(schema: Any, out: dict[str, Any]) -> None:
    """``$id`` and ``$anchor`` targets by name (iterative: the depth is not yet known)."""
    stack = [schema]
    while stack:
        node = stack.pop()
        if isinstance(node, list):
            stack.extend(node)
        elif isinstance(node, Mapping):
            for key in ("$id", "$anchor", "$dynamicAnchor"):
                name = node.get(key)
                if isinstance(name, str):
                    out.setdefault(name if key == "$id" else "#" + name, node)
            stack.extend(v for v in node.values() if isinstance(v, (Mapping, list)))


def _resolve(ref: str, base: Any, resources: Mapping[str, Any]) -> tuple[Any, Any]:
    """(the node ``ref`` points at inside this document, its resource), or None for the
    node (left to the compiler, which refuses what it cannot find)."""
    head, _, fragment = ref.partition("#")
    if head:
        base = resources.get(head)
        if base is None:
            return None, None
    if not fragment:
        return base, base
    if not fragment.startswith("/"):
        return resources.get("#" + fragment), base
    node = base
    for part in fragment[1:].split("/"):
        part = unquote(part).replace("~1", "/").replace("~0", "~")
        if isinstance(node, Mapping) and part in node:
            node = node[part]
        elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            return None, None
    return node, base


_RULE = re.compile(r"^[ \t]*[?!]?[A-Za-z_][A-Za-z0-9_]*(?:\.-?\d+)?[ \t]*(?::|::=)", re.M)
_JSON_BLOCK = re.compile(r"%json\s*(?=[{\[])")


def check_grammar_bounds(text: str, field: str, limits: GrammarLimits = LIMITS) -> None:
    """Refuse a Lark/GBNF grammar longer than ``limits.max_chars`` or with more than
    ``limits.max_rules`` rule definitions, and bound each embedded ``%json`` schema as a
    JSON Schema (the forced-tool grammars are made of those)."""
    if len(text) > limits.max_chars:
        raise _too_big(field, f"{len(text):,} characters")
    rules = len(_RULE.findall(text))
    if rules > limits.max_rules:
        raise _too_big(field, f"{rules:,} rules")
    decoder = json.JSONDecoder()
    for found in _JSON_BLOCK.finditer(text):
        try:
            schema, _ = decoder.raw_decode(text, found.end())
        except RecursionError:
            raise _too_big(field, "an embedded %json schema nested too deeply") from None
        except ValueError:
            continue  # not JSON: the compiler's own refusal says where
        check_schema_bounds(schema, field, limits)


class _Compiler:
    """Threads with a stack of :data:`COMPILE_STACK_BYTES` that run every llguidance compile
    (the default thread stack, 8 MiB, is where a hostile grammar would overflow)."""

    def __init__(self, threads: int = 2):
        self._count = threads
        self._queue: queue.SimpleQueue[tuple[Any, Future]] = queue.SimpleQueue()
        self._threads: list[threading.Thread] = []
        self._pid = os.getpid()
        self._lock = threading.Lock()

    def run(self, fn: Any) -> Any:
        if threading.current_thread() in self._threads:
            return fn()
        self._start()
        future: Future = Future()
        self._queue.put((fn, future))
        return future.result()

    def _start(self) -> None:
        with self._lock:
            if self._threads and self._pid == os.getpid():
                return
            self._pid, self._threads = os.getpid(), []  # a forked child starts its own
            previous = threading.stack_size(COMPILE_STACK_BYTES)
            try:
                for i in range(self._count):
                    thread = threading.Thread(target=self._work, name=f"onepass-grammar-{i}",
                                              daemon=True)
                    thread.start()
                    self._threads.append(thread)
            finally:
                threading.stack_size(previous)

    def _work(self) -> None:
        while True:
            fn, future = self._queue.get()
            if not future.set_running_or_notify_cancel():
                continue
            try:
                future.set_result(fn())
            except BaseException as exc:  # handed to the caller, never lost
                future.set_exception(exc)


_COMPILER = _Compiler()


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

    def __init__(self, info: TokenizerInfo, kind: str, source: str, template: Any,
                 field: str = "response_format", lock: threading.Lock | None = None):
        self.info = info
        self.kind = kind  # json_schema | json_object | grammar
        self.source = source
        self.field = field  # where the request gave it: named by a fault mid-sequence
        self._template = template  # a matcher at the start state, only ever copied
        self._lock = lock or threading.Lock()

    def for_field(self, field: str) -> Grammar:
        """This compiled grammar, as given by the request at ``field`` (shares the engine)."""
        if field == self.field:
            return self
        return Grammar(self.info, self.kind, self.source, self._template, field, self._lock)

    def matcher(self) -> Matcher:
        """A fresh matcher at the start of the grammar, for one sequence."""
        with self._lock:
            return Matcher(self._template.deep_copy(), self.info, self.field)


class Matcher:
    """One sequence's position in its grammar: the mask for the next token, then the token."""

    def __init__(self, engine: Any, info: TokenizerInfo, field: str | None = None):
        self._engine = engine
        self.info = info
        self.field = field
        import torch

        words = (info.vocab_size + 31) // 32
        self._words = torch.zeros(words, dtype=torch.int32)

    def _mask_words(self) -> torch.Tensor:
        """The allowed next tokens as packed 32-bit words, in place; a matcher in error, or
        one allowing nothing, is a :class:`GrammarError`."""
        self._engine.unsafe_compute_mask_ptr(self._words.data_ptr(), self._words.numel() * 4)
        if self._engine.is_error():
            raise self._error(f"grammar matcher failed: {self._engine.get_error()}")
        if not bool(self._words.any()):
            raise self._error("the grammar allows no next token")
        return self._words

    def _error(self, message: str) -> GrammarError:
        return GrammarError(_short(message), self.field)

    def allowed_mask(self, vocab_size: int | None = None,
                     device: torch.device | str = "cpu") -> torch.Tensor:
        """Boolean row of ``vocab_size`` (default: the vocabulary): True where the grammar
        allows the next token. EOS is allowed only where the grammar may end."""
        import torch

        n = self.info.vocab_size if vocab_size is None else vocab_size
        words = self._mask_words().to(device, non_blocking=True)
        bits = (words.unsqueeze(1) >> _shifts(words.device)) & 1
        mask = bits.flatten()[: min(n, self.info.vocab_size)].bool()
        if n > mask.numel():  # rows past the vocabulary are never allowed
            mask = torch.cat([mask, mask.new_zeros(n - mask.numel())])
        return mask

    def argmax(self, logits: Any) -> int:
        """The first highest logit among the tokens allowed next (greedy under the grammar):
        disallowed rows are -inf, so an end token wins only where the grammar may end.
        ``logits``: one row, a tensor or a numpy array (llama.cpp's, read in place)."""
        import torch

        logits = torch.as_tensor(logits)
        mask = self.allowed_mask(logits.shape[-1], device=logits.device)
        return int(torch.argmax(logits.float().masked_fill(~mask, float("-inf"))))

    def accept(self, token: int) -> None:
        """Advance past a drawn token; a token the grammar refuses is a :class:`GrammarError`."""
        if not self._engine.consume_token(int(token)):
            raise self._error(
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
    import torch

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
        check_grammar_bounds(grammar, field)
        kind, source = "grammar", grammar
    elif json_object:
        kind, source = "json_object", '{"type":"object"}'
    else:
        if not isinstance(json_schema, Mapping):
            raise ContractError(field, f"expected a JSON Schema object, got "
                                f"{_describe(json_schema)}")
        check_schema_bounds(json_schema, field)
        kind, source = "json_schema", _canonical(json_schema, field)
    key = (info, kind, source)
    with _CACHE_LOCK:
        found = _CACHE.get(key)
        if found is not None:
            _CACHE.move_to_end(key)
            return found.for_field(field)
    compiled = _COMPILER.run(lambda: _compile(info, kind, source, field))
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
    limits = _parser_limits()
    is_error, messages = llguidance.LLMatcher.validate_grammar_with_warnings(
        text, info.engine, limits=limits)
    if is_error or messages:  # a warning is a construct the engine would treat loosely
        raise ContractError(field, _refusal(kind, "; ".join(messages) or "invalid"))
    template = llguidance.LLMatcher(info.engine, text, log_level=0, limits=limits)
    if template.is_error():
        raise ContractError(field, _refusal(kind, template.get_error()))
    grammar = Grammar(info, kind, source, template, field)
    _probe(grammar, kind)
    return grammar


def _parser_limits() -> Any:
    """llguidance's own limits at their defaults, with terse errors (a verbose one repeats
    the whole grammar and parser state: megabytes, and the request's text, in a log line)."""
    import llguidance

    return llguidance.LLParserLimits(verbose_errors=False)


def _probe(grammar: Grammar, kind: str) -> None:
    """Walk the first :attr:`GrammarLimits.probe_tokens` tokens on a copy (the first allowed
    token each step): a grammar the parser cannot follow past its start (a rule of over
    2,000 alternatives meets llguidance's row limit at the first token) is refused here, by
    field, instead of failing its sequence mid-step."""
    import torch

    matcher = grammar.matcher()
    eos = [t for t in grammar.info.eos_ids if t < grammar.info.vocab_size]
    try:
        for _ in range(LIMITS.probe_tokens):
            if matcher.done:
                return
            mask = matcher.allowed_mask()
            mask[eos] = False
            allowed = torch.nonzero(mask)
            if not allowed.numel():
                return
            matcher.accept(int(allowed[0]))
    except GrammarError as exc:
        if matcher._engine.is_error():  # a parser fault (a limit), not just a dead end
            raise ContractError(grammar.field, _refusal(kind, str(exc))) from None


def _short(message: str) -> str:
    """An engine message on one line, at most 400 characters."""
    message = " ".join(message.split())
    return message[:400] + "..." if len(message) > 400 else message


def _refusal(kind: str, message: str) -> str:
    message = _short(message)
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
