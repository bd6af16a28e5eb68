"""DecisionEngine: contract → prompt → backend → readout.

The engine owns no tensors. It renders a request into one shared prefix and one suffix per
question, gives every question checked single-token labels, asks the backend for the logits of
those labels only, and turns them into typed answers.

Size: the engine is the library's front door: each request kind (System One, typed helpers,
schemas, generation) is a short method over the shared render-check-score-read path.
"""

from __future__ import annotations

import contextlib
import copy
import warnings
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from onepass import prompt as P
from onepass.backends.base import (
    VOCAB_LOGSUMEXP,
    VOCAB_MAX,
    Backend,
    capabilities,
    fewest_tokens,
)
from onepass.contract import (
    DEBIAS_MODES,
    ChoiceAnswer,
    ContractError,
    DecisionRequest,
    Question,
    ScoreAnswer,
    parse_request,
    resolves_to,
)
from onepass.generate.reasoning import decision_kwargs
from onepass.limits import too_long
from onepass.option_order import default_debias, order_warning
from onepass.readout import (
    argmax_first,
    choice_confidence,
    combine_rotations,
    divide_prior,
    expected_level,
    label_diagnostics,
    restricted_softmax,
    score_confidence,
    top_probability,
)

DEFAULT_MAX_INPUT_TOKENS = 8192
CONTENT_FREE_STATE = "N/A"
MAX_ROTATIONS = 16  # K > 16 options: 16 evenly spaced rotations (a K-fold prompt is K^2 lines)
DEFAULT_COMBINE = "mean"  # a mixture; onepass bench scores "logmean" beside it


@dataclass(frozen=True)
class Position:
    """One decision position: the suffix text after the shared prefix and its labels."""

    suffix: str
    labels: tuple[P.Label, ...]


Reading = tuple[Position, tuple[int, ...]]  # a position and the declared option of each label


@dataclass
class Scored:
    """Logits per position, the prompt ids they were read after, and the cached share."""

    logits: list[list[float]]
    prefix: list[int]
    suffixes: list[list[int]]
    cached_tokens: int
    written_tokens: int = 0
    # per position (score_positions(vocab=True)): the full vocabulary's log-sum-exp, max logit
    vocab: list[tuple[float, float]] | None = None

    @property
    def input_tokens(self) -> int:
        """Prompt tokens of the call: the shared prefix once, then every suffix."""
        return len(self.prefix) + sum(len(s) for s in self.suffixes)


@dataclass(frozen=True)
class EngineConfig:
    """Every :meth:`DecisionEngine.from_pretrained` option as one value: a command builds it
    once from its flags (:func:`onepass.commands.common.engine_config`), and ``serve`` only
    replaces what one resident model sets differently."""

    device: str = "auto"
    dtype: str = "auto"
    context_path: str | Path | None = None
    adapter: str | Path | None = None
    session_cache_entries: int = 16
    session_cache_tokens: int = 32768
    max_input_tokens: int = DEFAULT_MAX_INPUT_TOKENS
    temperature: float = 1.0
    served_name: str | None = None
    backend: str = "torch"
    engine: str | None = None
    engine_url: str | None = None
    engine_api_key: str | None = field(default=None, repr=False)  # never in a log line
    n_ctx: int | None = None
    n_threads: int | None = None
    compute: str | None = None


@dataclass
class EngineStats:
    requests: int = 0
    questions: int = 0
    input_tokens: int = 0
    cached_tokens: int = 0


class DecisionEngine:
    """Answers System One questions about a state from one forward pass.

    Build it with :meth:`from_pretrained` (the embedded default model when no name is given)
    or around any object that implements :class:`onepass.backends.Backend`.

    ``debias`` is how a request that names none is read; None picks ``name-order`` (a
    choice's options sorted by name: no declared order can move the answer), or ``none`` for
    weights onepass trained on the declared order (``trained``: their folder; see
    :mod:`onepass.option_order`).
    """

    def __init__(
        self,
        backend: Backend,
        *,
        context: str | None = None,
        max_input_tokens: int = DEFAULT_MAX_INPUT_TOKENS,
        temperature: float = 1.0,
        served_name: str | None = None,
        style: P.Style = P.DEFAULT_STYLE,
        chat_format: P.ChatFormat | None = None,
        debias: str | None = None,
        calibration: Any = None,
        abstain_below: float | None = None,
        adapter: str | None = None,
        trained: str | None = None,
    ):
        if not 0 < temperature < float("inf"):  # False for nan too
            raise ValueError(f"temperature must be a finite number > 0, got {temperature!r}")
        # the weights onepass may have trained (an adapter, else a checkpoint folder): their
        # training order picks the default debias (onepass/option_order.py)
        self.trained = adapter or trained
        self.debias = _check_debias(debias or default_debias(self.trained))
        if warning := order_warning(self.trained, self.debias):
            warnings.warn(warning, stacklevel=2)
        self.combine = DEFAULT_COMBINE
        self.max_rotations = MAX_ROTATIONS
        # what a calibration file must match (model, dtype, adapter, prompt version)
        self.adapter = adapter
        self.calibration: Any = None
        self.abstain_below: float | None = None
        self.backend = backend
        self.capabilities = capabilities(backend)
        self.context = context
        self.max_input_tokens = max_input_tokens
        self.temperature = temperature
        self.served_name = served_name or backend.name
        self.style = style
        if chat_format is None:
            chat_format = (
                P.ChatFormat.from_template(decision_render(backend))
                if backend.chat_template
                else P.PLAIN_FORMAT
            )
        self.format = chat_format
        self.specials = tuple(backend.special_tokens)
        self._label_memo: dict[str, tuple[int, str] | None] = {}
        self.stats = EngineStats()
        # tokens of the system prompt kept resident since start-up: every request's
        # cached_tokens includes them, so a state-prefix hit is cached_tokens > pinned_tokens
        self.pinned_tokens = 0
        self._generator: Any = None
        # TextGenerator options (default_max_output_tokens, max_sequences), set before first use
        self.generation_options: dict[str, Any] = {}
        # None: each call scores in its own forward; share_steps() routes scoring through the
        # generation scheduler so concurrent requests share forwards
        self.scorer: Any = None
        self._pin_system()
        if calibration is not None:
            self.set_calibration(calibration)
        if abstain_below is not None:
            self.set_abstain_below(abstain_below)

    # ------------------------------------------------------------------ construction

    @classmethod
    def from_pretrained(
        cls,
        model: str | None = None,
        *,
        device: str = "auto",
        dtype: str = "auto",
        context_path: str | Path | None = None,
        adapter: str | Path | None = None,
        session_cache_entries: int = 16,
        session_cache_tokens: int = 32768,
        max_input_tokens: int = DEFAULT_MAX_INPUT_TOKENS,
        temperature: float = 1.0,
        served_name: str | None = None,
        backend: str = "torch",
        engine: str | None = None,
        engine_url: str | None = None,
        engine_api_key: str | None = None,
        n_ctx: int | None = None,
        n_threads: int | None = None,
        compute: str | None = None,
    ) -> DecisionEngine:
        """Load ``model`` (embedded alias, GGUF file, checkpoint directory or hub id).

        ``backend``: ``torch`` (default, in process), ``llamacpp`` (a GGUF run natively by
        llama.cpp; ``n_ctx``/``n_threads``) or ``remote`` (``engine`` — sglang, vllm,
        llama-server or onepass — at ``engine_url``, sent ``engine_api_key`` as a bearer
        token when given; ``model`` names the
        checkpoint whose tokenizer and chat template render the prompts). The renderer, labels
        and readout are the same for all three. ``compute`` (torch only): the decoder linears'
        working weights (``auto``, ``stored``, ``int8``, ``float32``, ``bfloat16``,
        ``float16``; None: what a quantized artifact recorded, else ``auto``).
        """
        if compute is not None and backend != "torch":
            raise ValueError("--compute needs --backend torch (the other backends run the "
                             "weights as their engine stores them)")
        if backend == "llamacpp":
            if adapter is not None:
                raise ValueError("--adapter needs --backend torch (a GGUF is run as it is)")
            from onepass.backends import llamacpp

            chosen: Backend = llamacpp.load(
                model, n_ctx=n_ctx, n_threads=n_threads,
                cache_entries=session_cache_entries, cache_tokens=session_cache_tokens,
            )
        elif backend == "remote":
            from onepass.backends.remote import RemoteBackend

            if adapter is not None:
                raise ValueError("--adapter needs --backend torch: a remote engine serves its "
                                 "own weights (merge the adapter and serve the merged model)")
            if not engine or not engine_url:
                raise ValueError("--backend remote needs --engine and --engine-url")
            chosen = RemoteBackend.connect(engine, engine_url, model, api_key=engine_api_key)
        elif backend == "torch":
            from onepass.backends.torch import TorchBackend
            from onepass.models import resolve

            resolved = resolve(model)
            chosen = TorchBackend.load(
                resolved.path,
                name=resolved.name,
                device=device,
                dtype=dtype,
                cache_entries=session_cache_entries,
                cache_tokens=session_cache_tokens,
                adapter=adapter,
                compute=compute,
            )
        else:
            raise ValueError(f"backend must be torch, llamacpp or remote, got {backend!r}")
        context = Path(context_path).read_text() if context_path else None
        # what onepass train wrote for these weights (beside an adapter, or in a trained,
        # merged or quantized checkpoint): their option order and calibration
        own = adapter or (resolved.path if backend == "torch" else None)
        engine = cls(
            chosen,
            context=context,
            max_input_tokens=max_input_tokens,
            temperature=temperature,
            served_name=served_name,
            adapter=str(adapter) if adapter else None,
            trained=str(own) if own else None,
        )
        if own is not None:  # set_calibration(None) drops it
            from onepass.calibration import Calibration

            engine.calibration = Calibration.bundled(own, engine.identity())
        return engine

    @classmethod
    def from_config(cls, model: str | None, config: EngineConfig) -> DecisionEngine:
        """:meth:`from_pretrained` with its options given as one :class:`EngineConfig`."""
        return cls.from_pretrained(model, **{f.name: getattr(config, f.name)
                                             for f in fields(config)})

    def _pin_system(self) -> None:
        """Prefill the system part (instructions + context) once, at start-up."""
        pin = getattr(self.backend, "pin", None)
        if pin is None:
            return
        text = self.format.head + P.system_text(self.context, self.specials) + self.format.middle
        ids = self.backend.encode(text)
        if len(ids) > 2:
            pin(ids[:-2])  # leave the boundary tokens to the request: they may merge with it
            self.pinned_tokens = len(ids) - 2

    # ------------------------------------------------------------------ labels

    def _token_for(self, label: str) -> tuple[int, str] | None:
        """The label's token id right after the prompt tail, if it is exactly one token."""
        if label in self._label_memo:
            return self._label_memo[label]
        probe = "Answer." + self.format.tail + self.style.lead
        base = self.backend.encode(probe, bos=False)
        found = None
        # after whitespace (a chat header's newline) the bare label is natural; after text
        # ("Answer:") the spaced one is
        natural = (label, " " + label) if probe[-1:].isspace() else (" " + label, label)
        for spelling in natural:
            ids = self.backend.encode(probe + spelling, bos=False)
            if len(ids) == len(base) + 1 and ids[: len(base)] == base:
                found = (ids[-1], spelling)
                break
        self._label_memo[label] = found
        return found

    def draft(
        self, qtype: str, instructions: Any, options: Sequence[str], descriptions: Sequence[Any],
        exclude: set[int] | frozenset[int] = frozenset(),
    ) -> Position:
        """One question rendered with the first labels that are single tokens after the
        prompt's tail: not yet checked in the question's own context, so it costs no
        tokenization of the question (what :meth:`check_length` measures)."""
        try:
            pool = P.label_texts(qtype, len(options), self.style)
            labels = P.assign_labels(len(options), self._token_for, exclude, pool)
        except P.LabelError:  # a styled pool (Yes/No, digits) unusable here: letters
            labels = P.assign_labels(len(options), self._token_for, exclude)
        block = P.render_question(
            qtype, instructions, options, descriptions, [lb.text for lb in labels],
            self.specials, self.style,
        )
        return Position(P.render_suffix(self.format, block, self.style), tuple(labels))

    def position(
        self, qtype: str, instructions: Any, options: Sequence[str], descriptions: Sequence[Any]
    ) -> Position:
        """Render one question with labels checked in its own context (one tokenization of
        the question per label: check the prompt's length first)."""
        exclude: set[int] = set()
        for _ in range(4):
            drafted = self.draft(qtype, instructions, options, descriptions, exclude)
            base = self.backend.encode(drafted.suffix, bos=False)
            bad = {
                lb.token_id
                for lb in drafted.labels
                if self.backend.encode(drafted.suffix + lb.spelling, bos=False)
                != [*base, lb.token_id]
            }
            if not bad:
                return drafted
            exclude |= bad
        raise P.LabelError(f"no usable single-token labels for a {qtype} question in context")

    def question_position(self, q: Question) -> Position:
        return self.position(q.type, q.instructions, q.options, q.descriptions)

    def prompt_tokens(
        self, request: DecisionRequest, position: Callable[[Question], Position] | None = None,
    ) -> tuple[list[tuple[Question, Position]], list[int], list[list[int]]]:
        """The request's non-trivial questions with their positions, and the token ids of the
        shared prefix and of each question's suffix, as :meth:`answer` serves them: the trainer
        and the quantizer's calibration read exactly these prompts. ``position`` replaces
        :meth:`question_position` (a caller that memoizes repeated questions)."""
        prefix_text = P.render_prefix(self.format, request.state, self.context, self.specials)
        live = [q for q in request.questions if not q.is_trivial]
        positions = [(position or self.question_position)(q) for q in live]
        prefix, suffixes = self.tokenize(prefix_text, [p.suffix for p in positions])
        return list(zip(live, positions)), prefix, suffixes

    # ------------------------------------------------------------------ scoring

    def check_length(
        self,
        prefix_text: str,
        suffixes: Sequence[str],
        *,
        limit_field: str = "state",
        joined: bool = False,
    ) -> None:
        """Refuse a prompt over ``max_input_tokens`` before the work that scales with it.

        A prompt whose length alone proves it over the limit
        (:func:`~onepass.backends.base.fewest_tokens`) is refused untokenized. Otherwise the
        prefix and each suffix are tokenized once, so this costs time proportional to the
        input; only when their count is over the limit is the longest prompt tokenized whole,
        once, for the exact number (a token can merge across a joint). A count within the
        limit by a joint's merge is caught by :meth:`score_positions`. ``joined``: the
        suffixes follow one another in a single prompt (a sequential schema run, before its
        answers are written back); otherwise each one is its own prompt after the prefix.
        """
        if not suffixes:
            return
        tail = "".join(suffixes) if joined else max(suffixes, key=len)
        fewest = fewest_tokens(self.backend, prefix_text + tail)  # over: refused unencoded
        if fewest > self.max_input_tokens:
            when = " before any answer is written back" if joined else ""
            raise too_long(limit_field, f"at least {fewest}", self.max_input_tokens, when=when)
        sizes = [len(self.backend.encode(s, bos=False)) for s in suffixes]
        longest = max(range(len(sizes)), key=sizes.__getitem__)
        added = sum(sizes) if joined else sizes[longest]
        if len(self.backend.encode(prefix_text)) + added <= self.max_input_tokens:
            return
        tail = "".join(suffixes) if joined else suffixes[longest]
        n = len(self.backend.encode(prefix_text + tail))
        if n > self.max_input_tokens:
            when = " before any answer is written back" if joined else ""
            raise too_long(limit_field, n, self.max_input_tokens, when=when)

    def tokenize(
        self, prefix_text: str, suffixes: Sequence[str]
    ) -> tuple[list[int], list[list[int]]]:
        """Token ids of the shared prefix and of each suffix, exactly as the whole prompt
        tokenizes: the shared part is the longest common token prefix of every prompt."""
        prefix = self.backend.encode(prefix_text)
        fulls = [self.backend.encode(prefix_text + s) for s in suffixes]
        n = len(prefix)
        for full in fulls:
            limit = min(n, len(full) - 1)
            i = 0
            while i < limit and full[i] == prefix[i]:
                i += 1
            n = i
        return prefix[:n], [full[n:] for full in fulls]

    def score_positions(
        self,
        prefix_text: str,
        positions: Sequence[Position],
        *,
        limit_field: str = "state",
        naive: bool = False,
        namespace: str | None = None,
        vocab: bool = False,
    ) -> Scored:
        """Candidate logits for every position after one shared prefix, in one forward.

        ``naive=True`` runs each whole prompt through a plain full forward instead (no cache,
        no packing, full vocabulary): the reference the fast path is tested against.
        ``namespace``: the prefix-cache partition (only backends with ``cache_namespaces``).
        ``vocab``: also read each position's full-vocabulary log-sum-exp and largest logit
        (``Scored.vocab``; only backends with ``vocab_statistics``).
        """
        prefix, suffixes = self.tokenize(prefix_text, [p.suffix for p in positions])
        longest = len(prefix) + max((len(s) for s in suffixes), default=0)
        if longest > self.max_input_tokens:
            raise too_long(limit_field, longest, self.max_input_tokens)
        candidates = [[lb.token_id for lb in p.labels] for p in positions]
        if vocab:
            candidates = [[*c, VOCAB_LOGSUMEXP, VOCAB_MAX] for c in candidates]
        if naive:
            logits = [
                self.backend.reference_logits(prefix + s, c) for s, c in zip(suffixes, candidates)
            ]
            cached = written = 0
        else:
            extra = {} if namespace is None else {"namespace": namespace}
            result = (self.scorer or self.backend.score)(prefix, suffixes, candidates, **extra)
            logits, cached = result.logits, result.cached_tokens
            written = getattr(result, "written_tokens", 0)
        if not vocab:
            return Scored(logits, prefix, suffixes, cached, written)
        return Scored([row[:-2] for row in logits], prefix, suffixes, cached, written,
                      [(row[-2], row[-1]) for row in logits])

    # ------------------------------------------------------------------ order-invariance

    def readings(self, q: Question, debias: str = "none") -> list[Reading]:
        """The positions read for ``q``, each with the declared option index of its
        candidates in order.

        ``none`` (and ``content-free``, which reads the same positions twice): the declared
        order, one position. ``name-order``: a choice's options in a canonical order (by
        name), one position: any permutation of the declared options reads the same prompt,
        so the order cannot move the answer, at no cost (typed-lm's labelling); nouls and
        scores keep their order. ``rotations``: a choice's options are put
        in a canonical order (by name) and every cyclic rotation of it is a position, so any
        permutation of the declared options reads the same prompts (order-invariant to float
        error, K positions, not K!). A noul's yes/no and a score's levels keep their order
        (the levels mean "lowest to highest"); their labels rotate instead (A names "no" in
        the swapped noul), which cancels the label prior. Noul word labels (Yes/No) have none
        to cancel: one position. Over ``max_rotations`` options, that many evenly spaced
        rotations of the canonical order are read (still order-invariant: the canonical order
        does not depend on the declared one; each option is first in only some of them).
        """
        n, modes = len(q.options), debias.split("+")
        canonical = sorted(range(n), key=lambda i: q.options[i])
        if q.type == "choice" and n > 1 and "name-order" in modes:
            return [self._in_order(q, tuple(canonical))]
        if "rotations" not in modes or n < 2:
            return [(self.question_position(q), tuple(range(n)))]
        if q.type == "choice":
            count = min(n, self.max_rotations)
            return [self._in_order(q, tuple(canonical[r:] + canonical[:r]))
                    for r in sorted({i * n // count for i in range(count)})]
        base = self.question_position(q)
        if tuple(lb.text for lb in base.labels) == P.NOUL_WORDS:
            return [(base, tuple(range(n)))]
        out = [(base, tuple(range(n)))]
        for r in range(1, n):
            labels = base.labels[r:] + base.labels[:r]  # option i is read from labels[i]
            block = P.render_question(
                q.type, q.instructions, q.options, q.descriptions, [lb.text for lb in labels],
                self.specials, self.style,
            )
            out.append((self._checked(P.render_suffix(self.format, block, self.style), labels),
                        tuple(range(n))))
        return out

    def _in_order(self, q: Question, order: tuple[int, ...]) -> Reading:
        """A choice's position with its options in ``order`` (declared indices)."""
        return (self.position(q.type, q.instructions, [q.options[i] for i in order],
                              [q.descriptions[i] for i in order]), order)

    def _checked(self, suffix: str, labels: tuple[P.Label, ...]) -> Position:
        """A position whose labels were chosen elsewhere, checked in its own context."""
        base = self.backend.encode(suffix, bos=False)
        for lb in labels:
            if self.backend.encode(suffix + lb.spelling, bos=False) != [*base, lb.token_id]:
                raise P.LabelError(f"label {lb.text!r} is not one token after a rotated question")
        return Position(suffix, labels)

    # ------------------------------------------------------------------ calibration

    def identity(self) -> dict[str, Any]:
        """What a calibration or teach file must match: model, dtype, adapter, prompt."""
        model = getattr(self.backend, "model", None)
        dtype = getattr(model, "dtype", None) or getattr(self.backend, "dtype", None)
        return {
            "model": self.backend.name,
            "dtype": str(dtype).removeprefix("torch.") if dtype is not None else None,
            "adapter": self.adapter,
            "prompt_version": P.PROMPT_VERSION,
        }

    def set_calibration(self, calibration: Any) -> None:
        """Apply ``calibration`` (a :class:`onepass.calibration.Calibration` or a path to its
        file) to every answer read in the debias mode it was fitted on; refused when fitted for
        another model, dtype, adapter or prompt version."""
        from onepass.calibration import Calibration

        if calibration is None:
            self.calibration = None
            return
        if not isinstance(calibration, Calibration):
            calibration = Calibration.load(calibration)
        calibration.check(self.identity())
        self.calibration = calibration

    def set_abstain_below(self, threshold: float | None) -> None:
        """Mark answers whose top probability is under ``threshold`` (``"abstained": true``)."""
        if threshold is not None and not 0.0 <= threshold <= 1.0:
            raise ValueError(f"abstain_below must be within [0, 1], got {threshold!r}")
        self.abstain_below = threshold

    # ------------------------------------------------------------------ System One

    def check_request(self, request: DecisionRequest) -> None:
        """Refuse, before any model work, what this engine's backend cannot do for a request:
        a ``cache_salt``/``prompt_cache_key`` (partitions), ``diagnostics`` (full-vocabulary
        statistics), ``chat_template_kwargs`` (a template rendered with them; its format is
        derived here, so a template that fails on them is a 400 too)."""
        can = self.capabilities
        if request.cache_namespace is not None and not can.cache_namespaces:
            raise ContractError("cache_salt", "not supported by this model's backend (its "
                                "prefix cache has no partitions): send the request without it")
        if request.diagnostics and not can.vocab_statistics:
            raise ContractError("diagnostics", "not supported by this model's backend (it "
                                "reads the label logits only): send the request without it")
        if request.chat_template_kwargs:
            if not can.template_kwargs:
                raise ContractError("chat_template_kwargs", "this model's backend renders no "
                                    "chat template with arguments: send the request without it")
            self._templated(request.chat_template_kwargs)

    def _templated(self, kwargs: tuple[tuple[str, Any], ...]) -> DecisionEngine:
        """This engine reading prompts in the chat format its template gives with ``kwargs``:
        a shallow copy made now (same backend, scorer, cache, stats, calibration) with that
        format and its label memo, both kept for the last few distinct kwargs."""
        formats = self.__dict__.setdefault("_formats", OrderedDict())
        entry = formats.get(kwargs)  # no lock: a race renders one format twice, never fails
        if entry is None:
            try:
                fmt = P.ChatFormat.from_template(decision_render(self.backend, kwargs))
            except Exception as error:  # the template's own fault with these arguments
                raise ContractError("chat_template_kwargs", "the chat template cannot be "
                                    f"rendered with these arguments: {str(error)[:200]}"
                                    ) from None
            entry = formats[kwargs] = (fmt, {})
            while len(formats) > 8:
                with contextlib.suppress(KeyError):
                    formats.popitem(last=False)
        view = copy.copy(self)
        view.format, view._label_memo = entry
        return view

    def check_model(self, requested: str | None) -> None:
        if not resolves_to(requested, self.served_name):
            raise ContractError(
                "model",
                f"unknown model {requested!r}: this server serves {self.served_name!r} "
                "(also reachable as 'jev-latest', 'typed-lm' or any 'jev-*' name)",
                kind="model_not_found",
            )

    def answer(
        self, request: DecisionRequest | Mapping[str, Any] | Any, *, naive: bool = False,
        debias: str | None = None, cache_writes: bool = False,
    ) -> dict[str, Any]:
        """Answer a System One request; returns the response as a JSON-ready dict.

        ``naive=True`` answers through plain full forwards (see :meth:`score_positions`).
        ``debias`` (else the request's ``debias``, else the engine's): ``rotations`` scores
        every cyclic rotation of each question's options as more suffixes of the same forward
        (see :meth:`readings`) and combines them in declared order; ``content-free`` reads the
        same positions after a blank document (:data:`CONTENT_FREE_STATE`) and divides that
        prior out, so what the model answers whatever the document says carries no weight.
        ``cache_writes``: usage also says ``cache_write_tokens``, the prompt tokens this call
        computed and stored in the prefix cache (the OpenAI Decisions usage; System One's
        usage keeps its three fields). A request's ``cache_namespace`` partitions the prefix
        cache (a backend with ``cache_namespaces`` only).
        """
        if not isinstance(request, DecisionRequest):
            if hasattr(request, "model_dump"):
                request = request.model_dump(exclude_none=True)
            request = parse_request(request)
        self.check_model(request.model)
        self.check_request(request)
        if request.chat_template_kwargs:
            return self._templated(request.chat_template_kwargs).answer(
                replace(request, chat_template_kwargs=()), naive=naive, debias=debias,
                cache_writes=cache_writes)
        temperature = request.temperature or self.temperature
        prefix_text = P.render_prefix(self.format, request.state, self.context, self.specials,
                                      request.instructions)
        live = [q for q in request.questions if not q.is_trivial]
        self.check_length(prefix_text, [
            self.draft(q.type, q.instructions, q.options, q.descriptions).suffix for q in live
        ])
        mode = _check_debias(debias or request.debias or self.debias)
        readings = [self.readings(q, mode) for q in live]
        positions = [pos for group in readings for pos, _ in group]
        ns = request.cache_namespace
        calls = [self.score_positions(prefix_text, positions, naive=naive, namespace=ns,
                                      vocab=request.diagnostics)] if positions else []
        probs = self._read(live, readings, calls[0], temperature) if calls else {}
        if calls and "content-free" in mode.split("+"):
            # the same readings about a document that says nothing: the model's prior for each
            # question (contextual calibration); its prefix is cached, so it costs the suffixes
            blank = P.render_prefix(self.format, CONTENT_FREE_STATE, self.context, self.specials,
                                    request.instructions)
            calls.append(self.score_positions(blank, positions, naive=naive, namespace=ns))
            priors = self._read(live, readings, calls[1], temperature)
            probs = {k: divide_prior(p, priors[k]) for k, p in probs.items()}
        # each question's first reading (its declared order) in the main call
        first: dict[str, int] = {}
        if request.diagnostics and calls:
            at = 0
            for q, group in zip(live, readings):
                first[q.name] = at
                at += len(group)
        answers = {}
        for q in request.questions:
            p = probs.get(q.name, [1.0])
            # a calibration is fitted on one debias mode's distributions: only those get it
            if self.calibration is not None and q.name in probs \
                    and self.calibration.debias == mode:
                p = self.calibration.apply(q, p)
            answers[q.name] = _answer(q, p)
            if self.abstain_below is not None:
                answers[q.name]["abstained"] = top_probability(p) < self.abstain_below
            if q.name in first:  # read from the model, with the vocabulary's statistics
                at = first[q.name]
                answers[q.name]["diagnostics"] = label_diagnostics(
                    calls[0].logits[at], *calls[0].vocab[at])
        input_tokens = sum(c.input_tokens for c in calls)
        cached = sum(c.cached_tokens for c in calls)
        self.stats.requests += 1
        self.stats.questions += len(request.questions)
        self.stats.input_tokens += input_tokens
        self.stats.cached_tokens += cached
        usage = {"input_tokens": input_tokens, "output_tokens": len(live),
                 "cached_tokens": cached}
        if cache_writes:
            usage["cache_write_tokens"] = sum(c.written_tokens for c in calls)
        return {"model": self.served_name, "answers": answers, "usage": usage}

    def _read(self, live: Sequence[Question], readings: Sequence[Sequence[Reading]],
              scored: Scored, temperature: float) -> dict[str, list[float]]:
        """Each question's distribution in declared order, its readings combined."""
        probs: dict[str, list[float]] = {}
        at = 0
        for q, group in zip(live, readings):
            dists = []
            for _, order in group:
                p = restricted_softmax(scored.logits[at], temperature)
                at += 1
                declared = [0.0] * len(p)
                for j, option in enumerate(order):
                    declared[option] = p[j]
                dists.append(declared)
            probs[q.name] = dists[0] if len(dists) == 1 else combine_rotations(dists, self.combine)
        return probs

    # ------------------------------------------------------------------ typed helpers

    def noul(
        self,
        state: Any,
        proposition: Any,
        *,
        labels: Mapping[str, Any] | None = None,
        temperature: float | None = None,
        debias: str | None = None,
    ) -> float:
        """P(yes) that ``proposition`` holds for ``state``."""
        question: dict[str, Any] = {"type": "noul", "instructions": proposition}
        if labels:
            question["criteria"] = dict(labels)
        return self._one(state, question, temperature, debias)["noul"]

    def choice(
        self,
        state: Any,
        question: Any,
        options: Mapping[str, Any] | Sequence[str],
        *,
        temperature: float | None = None,
        debias: str | None = None,
    ) -> ChoiceAnswer:
        """One option of a closed set, with the distribution and its confidence."""
        criteria = dict(options) if isinstance(options, Mapping) else dict.fromkeys(options)
        raw = self._one(state, {"type": "choice", "instructions": question, "criteria": criteria},
                        temperature, debias)
        return ChoiceAnswer(**raw)

    def score(
        self,
        state: Any,
        question: Any,
        levels: Sequence[Any],
        *,
        temperature: float | None = None,
        debias: str | None = None,
    ) -> ScoreAnswer:
        """Expected level index over ordered ``levels``, with legend and confidence."""
        raw = self._one(
            state, {"type": "score", "instructions": question, "criteria": list(levels)},
            temperature, debias,
        )
        return ScoreAnswer(**raw)

    def _one(self, state: Any, question: dict[str, Any], temperature: float | None,
             debias: str | None = None) -> dict:
        request: dict[str, Any] = {"state": state, "questions": {"q": question}}
        if temperature is not None:
            request["temperature"] = temperature
        return self.answer(request, debias=debias)["answers"]["q"]

    def decide_schema(self, context: Any, schema: Mapping[str, Any], **options: Any) -> Any:
        """Ordered JSON-Schema decisions: see :func:`onepass.schema.decide_schema`."""
        from onepass.schema import decide_schema

        return decide_schema(self, context, schema, **options)

    # ------------------------------------------------------------------ generation

    @property
    def generator(self) -> Any:
        """The model's :class:`~onepass.generate.runner.TextGenerator` (made on first use)."""
        if self._generator is None:
            from onepass.generate.runner import TextGenerator

            self._generator = TextGenerator(self.backend, max_input_tokens=self.max_input_tokens,
                                            **self.generation_options)
        return self._generator

    def share_steps(self) -> None:
        """Score decisions inside the scheduler's steps, packed with every other decision and
        generation running at the same time (the server does this; a single-threaded caller
        gains nothing from it)."""
        if self.capabilities.steps:
            self.scorer = self.generator.scheduler.score

    def continuation(
        self, prompt: Sequence[int], max_tokens: int, *,
        stop: Callable[[list[int]], bool] | None = None, matcher: Any = None,
    ) -> tuple[list[int], int]:
        """The greedy continuation of ``prompt`` (an open field's value): ``(ids, prompt tokens
        taken from the cache)``. It ends before a special token, after the token that makes
        ``stop(ids)`` true, when ``matcher`` (a grammar matcher, advanced as it goes) is
        complete, or at ``max_tokens``.

        It is one more greedy sequence of the model's step scheduler (the one decode loop:
        the server's streams and a library caller's alike, on torch and llama.cpp), so it
        never holds the model while other streams wait; it reads the prompt through the prefix
        cache and stores it. A backend without generation steps (a remote engine) is asked
        itself (and refuses)."""
        if not self.capabilities.generation_steps:
            ids, _, cached = self.backend.generate(prompt, max_tokens, stop=stop,
                                                   matcher=matcher)
            return ids, cached
        if max_tokens <= 0 or (matcher is not None and matcher.done):
            return [], 0  # nothing may follow the prompt
        ends = set(self.backend.special_ids) | (set(matcher.info.eos_ids) if matcher else set())

        def until(ids: list[int]) -> bool:
            return ids[-1] in ends or (stop is not None and stop(ids))

        finish = self.generator.scheduler.complete(prompt, max_tokens, matcher=matcher,
                                                   until=until)
        if finish.error is not None:
            raise finish.error
        ids = list(finish.token_ids)
        if ids and ids[-1] in ends:
            ids.pop()  # ended at a special token: not part of the value
        return ids, finish.cached_tokens

    def generate(
        self, messages: str | Sequence[Mapping[str, Any]], *, system: str | None = None,
        max_tokens: int | None = None, response_format: Any = None, grammar: str | None = None,
        **sampling: Any,
    ) -> Any:
        """Chat completion from the same resident model: a
        :class:`~onepass.generate.runner.Generation` (text, finish reason, token usage).

        ``messages`` is a user message or OpenAI-style chat messages; ``sampling`` takes the
        OpenAI field names (temperature, top_p, top_k, min_p, stop, seed, ...).
        ``response_format`` (OpenAI's ``text``, ``json_object``, ``json_schema``) or
        ``grammar`` (Lark or GBNF) constrains every token: a result that finished with
        "stop" always parses and validates; one that ran out of tokens ("length") may be
        partial."""
        prompt, params, limit, compiled = self._generation(
            messages, system, max_tokens, sampling, response_format, grammar
        )
        return self.generator.run(prompt, params, limit, grammar=compiled)[0]

    def stream(
        self, messages: str | Sequence[Mapping[str, Any]], *, system: str | None = None,
        max_tokens: int | None = None, response_format: Any = None, grammar: str | None = None,
        **sampling: Any,
    ) -> Any:
        """Like :meth:`generate`, yielding the text as it is produced."""
        prompt, params, limit, compiled = self._generation(
            messages, system, max_tokens, sampling, response_format, grammar
        )
        return self.generator.stream_text(prompt, params, limit, grammar=compiled)

    def _generation(
        self, messages: Any, system: str | None, max_tokens: int | None, sampling: dict,
        response_format: Any = None, grammar: Any = None,
    ) -> tuple[list[int], Any, int, Any]:
        from onepass.generate.grammar import grammar_request, tokenizer_info
        from onepass.generate.sampling import SamplingParams

        spec = grammar_request(response_format, grammar)
        if isinstance(messages, str):
            messages = [{"role": "user", "content": messages}]
        messages = list(messages)
        if system is not None:
            messages.insert(0, {"role": "system", "content": system})
        params = SamplingParams.from_request({**sampling, "max_tokens": max_tokens})
        compiled = spec.compile(tokenizer_info(self.backend)) if spec is not None else None
        prompt = self.generator.chat_prompt(messages)
        limit = self.generator.output_limit(len(prompt), params.max_tokens)
        return prompt, params, limit, compiled


def decision_render(backend: Any, kwargs: Sequence[tuple[str, Any]] = ()
                    ) -> Callable[[list[dict[str, str]]], str]:
    """The backend's chat template as a decision renders it: with the request's template
    ``kwargs`` and, where the template has a thinking switch, thinking off (the label is then
    the reply's first token: Qwen3 writes an empty think block into the prompt)."""
    bound = decision_kwargs(getattr(backend, "chat_template", None), kwargs)
    if not bound or not capabilities(backend).template_kwargs:
        return backend.render_chat
    return lambda messages: backend.render_chat(messages, **bound)


def _check_debias(mode: str) -> str:
    if mode not in DEBIAS_MODES:
        raise ValueError(f"debias must be one of {DEBIAS_MODES}, got {mode!r}")
    return mode


def _answer(q: Question, probs: list[float]) -> dict[str, Any]:
    """Typed answer for one question from its distribution in declared order."""
    if q.type == "noul":
        return {"type": "noul", "noul": probs[0]}
    if q.type == "choice":
        return {
            "type": "choice",
            "choice": q.options[argmax_first(probs)],
            "probabilities": dict(zip(q.options, probs)),
            "confidence": choice_confidence(probs),
        }
    return {
        "type": "score",
        "score": expected_level(probs),
        "legend": {str(i): level for i, level in enumerate(q.descriptions)},
        "probabilities": {str(i): p for i, p in enumerate(probs)},
        "confidence": score_confidence(probs),
    }
