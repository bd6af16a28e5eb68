"""GGUF models run natively by llama.cpp (``pip install 'onepass[gguf]'``).

The weights stay quantized as the file ships them. The shared prefix is decoded once into
llama.cpp sequence 0; every question suffix is then scored from it. Two ways to do that were
measured (``benchmarks/backends.py --strategies``): ``sequences`` copies sequence 0 into one
sequence per suffix (a metadata copy in the unified KV cache) and decodes all suffixes in ONE
batch; ``truncate`` decodes each suffix after the prefix and removes it again. ``sequences`` is
the default: one pass over the weights for all suffixes. Prefix states are kept in the same
bounded :class:`~onepass.cache.PrefixCache` as the torch backend, as llama.cpp sequence-state
blobs (``llama_state_seq_get_data``), and the prefix live in sequence 0 is reused for free.

Text generation (chat, completions, responses) runs in the model's one step scheduler, in a
second llama.cpp context on the same weights (:mod:`onepass.backends.llamacpp_steps`): our
sampler and grammars, the same prefix cache, and decisions interleaved between its steps.

Tokenization, special tokens and the chat template come from the GGUF itself (the llama.cpp
tokenizer and ``tokenizer.chat_template``), so the engine's labels are checked against the
tokenizer that actually runs.
"""

from __future__ import annotations

import ctypes
import os
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from onepass.backends.base import ScoreResult, has_work
from onepass.cache import CacheStats, PrefixCache

INSTALL_HINT = (
    "the llamacpp backend needs llama-cpp-python: pip install 'onepass[gguf]' "
    "(it compiles llama.cpp once; set CMAKE_BUILD_PARALLEL_LEVEL to the number of cores)"
)
_ATTR_CONTROL = 1 << 3  # LLAMA_TOKEN_ATTR_CONTROL
_ATTR_USER_DEFINED = 1 << 4  # LLAMA_TOKEN_ATTR_USER_DEFINED
STRATEGIES = ("sequences", "truncate")
# llama.cpp's CPU matrix kernels switch to another path (other rounding) for micro-batches of
# about 64 tokens and more, so a question's logits would depend on what was decoded beside it
# and on how the prompt was split. Micro-batches of 32 stay on one path: a question scores the
# same alone, among sixteen, or in one full decode, bit for bit, for ~25% more time on a miss.
UBATCH = 32


def decode_rows(lc: Any, ctx: Any, batch: Any, rows: Sequence[tuple[int, int, int, bool]]
                ) -> None:
    """One llama_decode of ``(token, position, sequence, wants_logits)`` rows in ``ctx``."""
    batch.n_tokens = len(rows)
    for i, (token, pos, seq, logits) in enumerate(rows):
        batch.token[i] = token
        batch.pos[i] = pos
        batch.n_seq_id[i] = 1
        batch.seq_id[i][0] = seq
        batch.logits[i] = logits
    code = lc.llama_decode(ctx.ctx, batch)
    if code != 0:
        raise RuntimeError(f"llama_decode returned {code} (the KV cache of {ctx.n_ctx()} "
                           "tokens is full? raise --n-ctx)")


def _llama_cpp() -> Any:
    try:
        import llama_cpp
    except ImportError as exc:  # the extra is optional: say how to get it
        raise ImportError(INSTALL_HINT) from exc
    return llama_cpp


def gguf_path(model: str | None) -> tuple[Path, str]:
    """The GGUF file of an embedded alias or a ``.gguf`` path, and its served name."""
    from onepass.models import EMBEDDED, EMBEDDED_DEFAULT, ModelError

    name = model or EMBEDDED_DEFAULT
    if name in EMBEDDED:
        return EMBEDDED[name](), name
    path = Path(name).expanduser()
    if path.suffix.lower() != ".gguf":
        raise ModelError(
            f"the llamacpp backend runs GGUF files: {name!r} is neither an embedded alias "
            "nor a .gguf path (use --backend torch for checkpoint directories and hub ids)"
        )
    if not path.is_file():
        raise ModelError(f"GGUF file not found: {path}")
    return path, path.stem


def render_template(
    template: str, messages: list[dict[str, str]], *, bos_token: str = "", eos_token: str = ""
) -> str:
    """Render a Jinja chat template the way transformers' ``apply_chat_template`` does."""
    from datetime import datetime

    import jinja2
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message: str) -> None:
        raise jinja2.exceptions.TemplateError(message)

    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols]
    )
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    return env.from_string(template).render(
        messages=messages, add_generation_prompt=True, bos_token=bos_token, eos_token=eos_token
    )


class LlamaCppBackend:
    """A GGUF model in one llama.cpp context behind the backend protocol."""

    def __init__(
        self,
        path: str | Path,
        *,
        name: str | None = None,
        n_ctx: int = 4096,
        n_threads: int | None = None,
        n_batch: int = 512,
        n_ubatch: int = UBATCH,
        max_sequences: int = 16,
        cache_entries: int = 16,
        cache_tokens: int = 32768,
        strategy: str = "sequences",
    ):
        if strategy not in STRATEGIES:
            raise ValueError(f"strategy must be one of {STRATEGIES}, got {strategy!r}")
        lc = _llama_cpp()
        from llama_cpp import _internals
        from llama_cpp._logger import set_verbose

        set_verbose(False)  # llama.cpp logs every graph node at debug level: costly and noisy
        self._lc = lc
        self.path = Path(path)
        self.name = name or self.path.stem
        self.strategy = strategy
        threads = n_threads or max(1, min(os.cpu_count() or 1, 8))
        lc.llama_backend_init()
        mparams = lc.llama_model_default_params()
        self._model = _internals.LlamaModel(path_model=str(path), params=mparams, verbose=False)
        self.n_threads = threads
        self.n_ubatch = n_ubatch
        self.max_sequences = max(1, max_sequences)
        self._ctx = self.new_context(n_ctx, n_batch, self.max_sequences)
        self.n_ctx = self._ctx.n_ctx()
        self.n_batch = n_batch
        self._batch = lc.llama_batch_init(n_batch, 0, self.max_sequences)
        self._n_vocab = self._model.n_vocab()
        self._vocab = lc.llama_model_get_vocab(self._model.model)
        self.cache: PrefixCache[bytes] = PrefixCache(cache_entries, cache_tokens)
        self._live: list[int] = []  # the tokens whose KV sequence 0 holds now
        self._lock = threading.Lock()
        meta = self._model.metadata()
        self.metadata = meta
        self.chat_template: str | None = meta.get("tokenizer.chat_template")
        specials, self._control = set(), set()
        for t in range(self._n_vocab):
            attr = self._model.token_get_attr(t)
            if attr & (_ATTR_CONTROL | _ATTR_USER_DEFINED):
                text = self._model.token_get_text(t)
                if attr & _ATTR_CONTROL:
                    self._control.add(t)
                if attr & _ATTR_CONTROL or (text.startswith("<") and text.endswith(">")):
                    specials.add(text)
        self.special_tokens = tuple(sorted(specials))
        self.bos_id = self._model.token_bos() if self._model.add_bos_token() else None
        self.quantization = meta.get("general.file_type")
        self.weight_bytes = self._model.size()

    def new_context(self, n_ctx: int, n_batch: int, max_sequences: int) -> Any:
        """A llama.cpp context on this model's weights (the decisions' one, and generation's:
        :mod:`onepass.backends.llamacpp_steps`)."""
        from llama_cpp import _internals

        cparams = self._lc.llama_context_default_params()
        cparams.n_ctx = n_ctx
        cparams.n_batch = n_batch
        cparams.n_ubatch = min(self.n_ubatch, n_batch)
        cparams.n_seq_max = max_sequences
        cparams.kv_unified = True  # sequences share cells: a copy of the prefix is free
        cparams.n_threads = self.n_threads
        cparams.n_threads_batch = self.n_threads
        return _internals.LlamaContext(model=self._model, params=cparams, verbose=False)

    def close(self) -> None:
        if getattr(self, "_batch", None) is not None:
            self._lc.llama_batch_free(self._batch)
            self._batch = None
        self._ctx.close()
        self._model.close()

    # ------------------------------------------------------------------ tokenizer

    def encode(self, text: str, *, bos: bool = True) -> list[int]:
        ids = self._model.tokenize(text.encode(), add_bos=False, special=True) if text else []
        if bos and self.bos_id is not None and (not ids or ids[0] != self.bos_id):
            ids = [self.bos_id, *ids]
        return list(ids)

    def decode(self, ids: Sequence[int]) -> str:
        return self._model.detokenize(list(ids), special=True).decode("utf-8", errors="replace")

    def render_chat(self, messages: list[dict[str, str]]) -> str:
        if not self.chat_template:
            raise ValueError(f"{self.name} has no chat template in its GGUF metadata")
        bos = self._model.token_get_text(self._model.token_bos()) if self.bos_id else ""
        eos = self._model.token_get_text(self._model.token_eos())
        return render_template(self.chat_template, messages, bos_token=bos, eos_token=eos)

    # ------------------------------------------------------------------ llama.cpp calls

    def _decode(self, rows: Sequence[tuple[int, int, int, bool]]) -> None:
        decode_rows(self._lc, self._ctx, self._batch, rows)

    def _row_logits(self, index: int, candidates: Sequence[int]) -> list[float]:
        ptr = self._lc.llama_get_logits_ith(self._ctx.ctx, index)
        return [float(ptr[c]) for c in candidates]

    def _extend(self, tokens: Sequence[int], start: int, *, last_logits: bool) -> None:
        """Decode ``tokens[start:]`` into sequence 0 in chunks of ``n_batch``."""
        for lo in range(start, len(tokens), self.n_batch):
            hi = min(lo + self.n_batch, len(tokens))
            self._decode([(tokens[i], i, 0, last_logits and i == len(tokens) - 1)
                          for i in range(lo, hi)])
        self._live = list(tokens)

    def _restore(self, tokens: Sequence[int], *, need_last: bool) -> int:
        """Make sequence 0 hold ``tokens`` (from the live sequence or the prefix cache);
        returns how many tokens were reused. ``need_last``: the last token's logits are read,
        so it is decoded again when everything was reused."""
        live = 0
        for a, b in zip(self._live, tokens):
            if a != b:
                break
            live += 1
        stored, blob = self.cache.longest_prefix(tokens) if tokens else (0, None)
        mem = self._ctx.memory
        if blob is not None and stored > live:
            self._lc.llama_memory_clear(mem, True)
            buf = (ctypes.c_uint8 * len(blob)).from_buffer_copy(blob)
            if self._lc.llama_state_seq_set_data(self._ctx.ctx, buf, len(blob), 0) == 0:
                self._lc.llama_memory_clear(mem, True)
                stored = 0
            reused = stored
        else:
            self._lc.llama_memory_seq_rm(mem, -1, live, -1)
            for seq in range(1, self.max_sequences):
                self._lc.llama_memory_seq_rm(mem, seq, -1, -1)
            reused = live
        self._live = list(tokens[:reused])
        start = reused
        if need_last and start == len(tokens) and start:
            start -= 1
            self._lc.llama_memory_seq_rm(mem, 0, start, -1)
        self._extend(tokens, start, last_logits=need_last)
        return reused

    def _store(self, tokens: Sequence[int], *, pinned: bool = False) -> None:
        """Save sequence 0 (which holds ``tokens``) into the prefix cache."""
        if not tokens or not (pinned or self.cache.enabled):
            return
        size = self._lc.llama_state_seq_get_size(self._ctx.ctx, 0)
        buf = (ctypes.c_uint8 * size)()
        written = self._lc.llama_state_seq_get_data(self._ctx.ctx, buf, size, 0)
        blob = bytes(buf[:written])
        if pinned:
            self.cache.pin(tokens, blob)
        else:
            self.cache.put(tokens, blob)

    def _cached(self, tokens: Sequence[int]) -> bool:
        key = tuple(tokens)
        return key in self.cache._items or key in self.cache._pinned

    # ------------------------------------------------------------------ protocol

    def prefill(self, prefix: Sequence[int]) -> int:
        with self._lock:
            reused = self._restore(prefix, need_last=False)
            if not self._cached(prefix):
                self._store(prefix)
            return reused

    def pin(self, prefix: Sequence[int]) -> None:
        """Compute ``prefix`` once and keep it resident outside the LRU (system context)."""
        with self._lock:
            self._restore(prefix, need_last=False)
            self._store(prefix, pinned=True)

    def score(
        self,
        prefix: Sequence[int],
        suffixes: Sequence[Sequence[int]],
        candidates: Sequence[Sequence[int]],
    ) -> ScoreResult:
        if not has_work(suffixes, candidates):
            return ScoreResult([], 0)
        longest = len(prefix) + max(len(s) for s in suffixes)
        if longest > self.n_ctx:
            raise ValueError(f"a prompt of {longest} tokens exceeds the context of {self.n_ctx}")
        with self._lock:
            cached = self._restore(prefix, need_last=False)
            if prefix and not self._cached(prefix):
                self._store(prefix)
            if self.strategy == "truncate":
                logits = self._score_truncate(len(prefix), suffixes, candidates)
            else:
                logits = self._score_sequences(len(prefix), suffixes, candidates)
        return ScoreResult(logits, cached)

    def _score_truncate(self, p: int, suffixes: Sequence[Sequence[int]],
                        candidates: Sequence[Sequence[int]]) -> list[list[float]]:
        out = []
        mem = self._ctx.memory
        for suffix, cands in zip(suffixes, candidates):
            for lo in range(0, len(suffix), self.n_batch):
                hi = min(lo + self.n_batch, len(suffix))
                self._decode([(suffix[i], p + i, 0, i == len(suffix) - 1)
                              for i in range(lo, hi)])
            out.append(self._row_logits(-1, cands))
            self._lc.llama_memory_seq_rm(mem, 0, p, -1)
        return out

    def _score_sequences(self, p: int, suffixes: Sequence[Sequence[int]],
                         candidates: Sequence[Sequence[int]]) -> list[list[float]]:
        """All suffixes in one decode (or a few, bounded by n_batch and the sequences)."""
        out: list[list[float] | None] = [None] * len(suffixes)
        mem = self._ctx.memory
        groups: list[list[int]] = [[]]
        size = 0
        for i, suffix in enumerate(suffixes):
            full = len(groups[-1]) >= self.max_sequences - 1 or size + len(suffix) > self.n_batch
            if groups[-1] and full:
                groups.append([])
                size = 0
            groups[-1].append(i)
            size += len(suffix)
        for group in groups:
            if len(suffixes[group[0]]) > self.n_batch:  # one long suffix: plain decodes
                out[group[0]] = self._score_truncate(p, [suffixes[group[0]]],
                                                     [candidates[group[0]]])[0]
                continue
            rows, ends = [], []
            for seq, i in enumerate(group, start=1):
                if p:
                    self._lc.llama_memory_seq_cp(mem, 0, seq, -1, -1)
                suffix = suffixes[i]
                rows += [(t, p + k, seq, k == len(suffix) - 1) for k, t in enumerate(suffix)]
                ends.append(len(rows) - 1)
            self._decode(rows)
            for i, end in zip(group, ends):
                out[i] = self._row_logits(end, candidates[i])
            for seq in range(1, len(group) + 1):
                self._lc.llama_memory_seq_rm(mem, seq, -1, -1)
        return [row for row in out if row is not None]

    def reference_logits(self, tokens: Sequence[int], candidates: Sequence[int]) -> list[float]:
        """The naive path: the whole prompt decoded from an empty cache, nothing reused."""
        with self._lock:
            self._lc.llama_memory_clear(self._ctx.memory, True)
            self._live = []
            self._extend(tokens, 0, last_logits=True)
            return self._row_logits(-1, candidates)

    def cache_stats(self) -> CacheStats:
        return self.cache.stats()

    # ------------------------------------------------------------------ generation

    def generation_steps(self, max_sequences: int) -> Any:
        """The step calls the generation scheduler drives (chat, completions, responses):
        :class:`~onepass.backends.llamacpp_steps.LlamaCppSteps`, in a context of its own."""
        from onepass.backends.llamacpp_steps import LlamaCppSteps

        return LlamaCppSteps(self, max_sequences=max_sequences)

    @property
    def context_length(self) -> int:
        return self.n_ctx

    @property
    def vocab_size(self) -> int:
        return self._n_vocab

    @property
    def llama_vocab(self) -> Any:
        """The model's ``llama_vocab`` pointer: the grammar engine reads the vocabulary and
        tokenizes through it (``generate.grammar.tokenizer_info``)."""
        return self._vocab

    @property
    def eos_ids(self) -> frozenset[int]:
        ids = {self._model.token_eos(), self._model.token_eot()}
        return frozenset(i for i in ids if i >= 0) | frozenset(self._control)

    @property
    def special_ids(self) -> frozenset[int]:
        """Every control token: a greedy open value ends at the first one (not returned)."""
        return self.eos_ids

    def generate(self, tokens: Sequence[int], max_new_tokens: int, *, stop: Any = None,
                 candidates: Sequence[int] = ()) -> tuple[list[int], list[float], int]:
        """Candidate logits at the end of ``tokens``, which stay cached (a sequential schema
        reading). Text is generated in the step scheduler (:meth:`generation_steps`), not
        here: ``max_new_tokens`` must be 0."""
        if max_new_tokens > 0:
            raise ValueError("the llamacpp backend generates in the step scheduler "
                             "(generation_steps), not in generate()")
        if not tokens:
            raise ValueError("generate needs at least one prompt token")
        if len(tokens) > self.n_ctx:
            raise ValueError(f"{len(tokens)} prompt tokens exceed the context of {self.n_ctx}")
        with self._lock:
            cached = self._restore(tokens, need_last=True)
            if not self._cached(tokens):
                self._store(tokens)
            logits = self._row_logits(-1, candidates) if candidates else []
        return [], logits, cached


def load(
    model: str | None = None,
    *,
    n_ctx: int | None = None,
    n_threads: int | None = None,
    cache_entries: int = 16,
    cache_tokens: int = 32768,
) -> LlamaCppBackend:
    """The llamacpp backend for an embedded alias or a ``.gguf`` path."""
    path, name = gguf_path(model)
    return LlamaCppBackend(
        path, name=name, n_ctx=n_ctx or 4096, n_threads=n_threads,
        cache_entries=cache_entries, cache_tokens=cache_tokens,
    )
