"""The one small protocol every backend implements."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from onepass.cache import CacheStats

VOCAB_LOGSUMEXP = -1
VOCAB_MAX = -2
"""Pseudo-candidate ids a backend with ``vocab_statistics`` reads in place of a token: the
log-sum-exp and the largest logit of the row over its whole vocabulary (System One's
``diagnostics``: the labels' share of all probability, whether the argmax is a label)."""


@dataclass(frozen=True)
class ScoreResult:
    """Candidate logits per suffix, in the order the candidates were given.

    ``cached_tokens`` is how many prefix tokens came from the prefix cache instead of being
    computed for this call; ``written_tokens`` how many prefix tokens this call computed and
    stored in the prefix cache (0 where a backend does not say).
    """

    logits: list[list[float]]
    cached_tokens: int
    written_tokens: int = 0


def has_work(suffixes: Sequence[Sequence[int]], candidates: Sequence[Sequence[int]]) -> bool:
    """Check ``score``'s arguments (one candidate list per suffix, no empty suffix); False
    when there is nothing to score."""
    if len(suffixes) != len(candidates):
        raise ValueError("one candidate list per suffix is needed")
    if any(len(s) == 0 for s in suffixes):
        raise ValueError("every suffix needs at least one token")
    return bool(suffixes)


@dataclass(frozen=True)
class StepRow:
    """One row of a step backend's forward (the scheduler builds them): the next tokens of
    one running sequence (``owner``, its arena block ``table``), at positions ``start, ...``;
    ``logits`` asks for the full-vocabulary logits at the last."""

    table: list[int]
    owner: int
    tokens: Sequence[int]
    start: int
    logits: bool = True
    parent: int | None = None  # another owner whose rows these queries also see
    parent_table: Sequence[int] = ()
    every: bool = False  # the hidden states of all its tokens (a reading), not the last's
    decode: bool = False  # the last generated token of a running stream (not a prompt's)


@dataclass(frozen=True)
class ByteBound:
    """How a byte-level tokenizer covers its input: every byte it keeps lands in exactly one
    token, and one token stands for at most ``longest`` bytes; ``dropped`` are the bytes it
    silently drops (not in its vocabulary: SmolLM2 drops 0x04, say). So a text of ``k`` kept
    bytes encodes to at least ``ceil(k / longest)`` tokens, a bound found without encoding."""

    longest: int
    dropped: bytes

    def fewest_tokens(self, text: str) -> int:
        kept = len(text.encode("utf-8", "surrogatepass").translate(None, self.dropped))
        return -(-kept // self.longest)


def byte_bound(tokenizer: Any) -> ByteBound | None:
    """The :class:`ByteBound` of a transformers tokenizer when it is a byte-level BPE with no
    normalizer (nothing rewritten) and no added token that strips whitespace around it; None
    otherwise (no sound bound: such prompts are tokenized whole)."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None or backend.normalizer is not None:
        return None
    from tokenizers import decoders, models, pre_tokenizers
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    pre = backend.pre_tokenizer
    parts = list(getattr(pre, "pretokenizers", None) or [pre])  # a Sequence holds several
    if not isinstance(backend.model, models.BPE) or not any(
            isinstance(p, pre_tokenizers.ByteLevel) for p in parts):
        return None
    added = list(tokenizer.added_tokens_decoder.values())
    if any(t.lstrip or t.rstrip for t in added):
        return None
    vocab = backend.get_vocab(with_added_tokens=False)
    dropped = bytes(b for b, c in bytes_to_unicode().items() if c not in vocab)
    byte_level = decoders.ByteLevel()
    longest = max(len(byte_level.decode([t]).encode("utf-8", "surrogatepass")) for t in vocab)
    return ByteBound(max([longest, *(len(t.content.encode("utf-8")) for t in added)]), dropped)


def fewest_tokens(backend: Any, text: str) -> int:
    """A lower bound on the tokens ``text`` encodes to (0 when the backend's tokenizer has no
    :class:`ByteBound`): a prompt whose bound is over the input limit is refused before it is
    tokenized (a 1.5 MB prompt took seconds to tokenize only to be refused)."""
    bound = getattr(backend, "byte_bound", None)
    return bound.fewest_tokens(text) if bound is not None else 0


@dataclass(frozen=True)
class Capabilities:
    """What a backend does beyond :class:`Backend`, read once when an engine is built: the
    engine, the schema runner and the routes ask these flags, never the backend itself.

    ``steps``: ``step``/``decode`` over sequences in a KV arena (the step scheduler: every
    generation, open field and prompt reading; it generates text). ``generation_steps``: the
    chat, completions and responses routes run on it in the step scheduler: ``steps``, or a
    backend whose ``generation_steps(max_sequences)`` gives those calls for generation
    sequences alone (llama.cpp: :mod:`~onepass.backends.llamacpp_steps`), and so do a
    schema's open fields. ``generates``: a backend without
    ``steps`` whose ``generate(tokens, 0, candidates=...)`` reads candidate logits at the end
    of a prompt and keeps the prompt cached (a sequential schema reading: llama.cpp, a remote
    engine).
    ``embeds``: ``embedding_reader`` (pooled decoder embeddings). ``scores_prompts``:
    ``scoring_reader`` (a prompt's own logprobs: /v1/completions with echo). ``cache_namespaces``: a
    partitioned prefix cache (``cache_salt``, ``prompt_cache_key``). ``vocab_statistics``: the
    full vocabulary's log-sum-exp and largest logit as pseudo-candidates (``diagnostics``).
    ``template_kwargs``: ``render_chat(messages, **kwargs)``. ``tool_templates``:
    ``render_chat_tools`` (a template's native tools). ``forwards_generation``:
    ``forward_openai`` (a remote engine generates: the OpenAI
    generation routes send the client's request on to it)."""

    steps: bool = False
    generation_steps: bool = False
    generates: bool = False
    embeds: bool = False
    scores_prompts: bool = False
    cache_namespaces: bool = False
    vocab_statistics: bool = False
    template_kwargs: bool = False
    tool_templates: bool = False
    forwards_generation: bool = False


def capabilities(backend: Any) -> Capabilities:
    """The :class:`Capabilities` of ``backend`` (its methods and declared flags)."""
    steps = callable(getattr(backend, "step", None))
    generates = callable(getattr(backend, "generate", None))
    generation_steps = callable(getattr(backend, "generation_steps", None))
    return Capabilities(
        steps=steps,
        generation_steps=steps or generation_steps,
        generates=generates,
        embeds=callable(getattr(backend, "embedding_reader", None)),
        scores_prompts=callable(getattr(backend, "scoring_reader", None)),
        cache_namespaces=bool(getattr(backend, "cache_namespaces", False)),
        vocab_statistics=bool(getattr(backend, "vocab_statistics", False)),
        template_kwargs=bool(getattr(backend, "chat_template", None))
        and bool(getattr(backend, "chat_template_kwargs", False)),
        tool_templates=callable(getattr(backend, "render_chat_tools", None)),
        forwards_generation=callable(getattr(backend, "forward_openai", None)),
    )


@runtime_checkable
class Backend(Protocol):
    name: str
    special_tokens: tuple[str, ...]
    chat_template: str | None

    def encode(self, text: str, *, bos: bool = True) -> list[int]:
        """Token ids of ``text``; ``bos`` prepends the model's BOS token if the model uses one."""
        ...

    def render_chat(self, messages: list[dict[str, str]]) -> str:
        """The model's chat template applied to ``messages`` with the generation prompt."""
        ...

    def score(
        self,
        prefix: Sequence[int],
        suffixes: Sequence[Sequence[int]],
        candidates: Sequence[Sequence[int]],
    ) -> ScoreResult:
        """Logits of ``candidates[i]`` at the last position of ``prefix + suffixes[i]``."""
        ...

    def prefill(self, prefix: Sequence[int]) -> int:
        """Compute and cache ``prefix`` ahead of time; returns how many tokens were reused."""
        ...

    def reference_logits(self, tokens: Sequence[int], candidates: Sequence[int]) -> list[float]:
        """The naive path: candidate logits from one plain forward of the whole prompt."""
        ...

    def cache_stats(self) -> CacheStats: ...
