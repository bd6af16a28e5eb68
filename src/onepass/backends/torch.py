"""In-process PyTorch backend (transformers models): the shared-prefix, packed-suffix fast path.

One request costs:

1. the prefix (system context + state): taken from the prefix cache, or computed once on top
   of the longest cached entry it starts with;
2. every question suffix in ONE forward: the suffixes are packed into a single sequence with a
   block-diagonal causal mask over themselves, full visibility of the prefix, and positions
   restarted at the prefix length, so each suffix sees exactly what it would see alone;
3. the last hidden state of each suffix times the output-projection rows of its candidate
   labels only (a few dot products instead of the full vocabulary).

Cached key/value tensors are never written to: each forward builds a fresh cache object whose
layers concatenate new tensors onto the stored ones.

Size: the backend protocol on one transformers model: the packed fast path, its naive
reference, the prefix cache, step forwards and the readers that share them; each part reads
the same model, cache and attention internals.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, DynamicCache

from onepass.backends import packed_attention
from onepass.backends.base import (
    VOCAB_LOGSUMEXP,
    VOCAB_MAX,
    ScoreResult,
    StepRow,
    byte_bound,
    has_work,
)
from onepass.backends.kv_arena import ArenaCache, KVArena
from onepass.backends.packed_attention import Segment, Segments
from onepass.backends.rows import make_rows_invariant
from onepass.cache import CacheStats, PrefixCache
from onepass.models import cache_dir, check_family
from onepass.quant.artifact import (
    QuantizeError,
    load_quantized,
    read_quantization,
    resolve_compute,
)
from onepass.quant.linear import to_working_weights, weight_bytes, working_candidates

KV = tuple[tuple[torch.Tensor, torch.Tensor], ...]
MERGE_PAIRS = 32768


def pick_device(device: str = "auto") -> torch.device:
    if device == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda")
        if getattr(torch.backends, "mps", None) and torch.backends.mps.is_available():
            return torch.device("mps")
        return torch.device("cpu")
    if device not in ("cpu", "cuda", "mps") and not device.startswith("cuda:"):
        raise ValueError(f"device: expected auto, cpu, cuda or mps, got {device!r}")
    return torch.device(device)


def cpu_has_bf16() -> bool:
    """Whether the CPU reports native bfloat16 arithmetic (AVX512-BF16 or AMX-BF16): there a
    bfloat16 forward is ~2x faster than float32; elsewhere bfloat16 is emulated and slower."""
    capabilities = getattr(torch.cpu, "get_capabilities", None)
    if capabilities is not None:
        found = capabilities()
        return bool(found.get("avx512_bf16") or found.get("amx_bf16"))
    try:  # older torch: the kernel's own flags
        flags = Path("/proc/cpuinfo").read_text().split()
    except OSError:
        return False
    return "avx512_bf16" in flags or "amx_bf16" in flags


def pick_dtype(dtype: str, device: torch.device) -> torch.dtype:
    """``auto``: bfloat16 on a CPU with native bfloat16 units (float32 elsewhere on CPU, where
    bfloat16 is emulated and slower), bf16/fp16 on CUDA. The candidate-row readout is float32
    in every dtype."""
    table = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
    if dtype == "auto":
        if device.type == "cuda":
            return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
        if device.type == "cpu" and cpu_has_bf16():
            return torch.bfloat16
        return torch.float32
    if dtype not in table:
        raise ValueError(f"dtype: expected auto, float32, bfloat16 or float16, got {dtype!r}")
    return table[dtype]


class TorchBackend:
    """A transformers causal LM behind the backend protocol."""

    cache_namespaces = True  # score(namespace=...) partitions the prefix cache
    chat_template_kwargs = True  # render_chat(messages, **kwargs)
    vocab_statistics = True  # candidates may include VOCAB_LOGSUMEXP / VOCAB_MAX

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        *,
        name: str,
        cache_entries: int = 16,
        cache_tokens: int = 32768,
        max_packed_tokens: int = 4096,
    ):
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.name = name
        self.decoder = model.get_decoder()
        self.lm_head = model.get_output_embeddings()
        config = model.config.get_text_config(decoder=True)
        self.config = config
        self.softcap = getattr(config, "final_logit_softcapping", None)
        self.window = getattr(config, "sliding_window", None)
        self.layer_types = tuple(getattr(config, "layer_types", None) or ())
        self.device = next(model.parameters()).device
        self.cache: PrefixCache[KV] = PrefixCache(cache_entries, cache_tokens)
        self.chat_template = getattr(tokenizer, "chat_template", None)
        self.special_tokens = tuple(
            sorted({str(t) for t in tokenizer.all_special_tokens} | _added_special(tokenizer))
        )
        probe = tokenizer("a", add_special_tokens=True)["input_ids"]
        bos = tokenizer.bos_token_id
        self.bos_id = bos if bos is not None and probe and probe[0] == bos else None
        self.byte_bound = byte_bound(tokenizer)  # a prompt certainly over the limit: no encode
        self.max_packed_tokens = max_packed_tokens
        # On a miss the uncached prefix joins the first packed forward (one weight pass
        # instead of two) while the attention that wastes, prefix rows x suffix keys, stays
        # under this many pairs: past ~32k pairs it cost more than the pass it saved
        # (benchmarks/engine_speed.py, CPU). Quantized weights make a pass ~4x dearer.
        self.merge_pairs = MERGE_PAIRS
        # the batch-invariant attention (packed_attention.py) wherever sdpa would run; an
        # eager model (Gemma 2's capped attention logits) takes dense additive masks
        attention = getattr(model.config, "_attn_implementation", "sdpa")
        if attention == "sdpa":
            model.set_attn_implementation(packed_attention.NAME)
        self._segmented = attention in ("sdpa", packed_attention.NAME)
        self.row_scheme = make_rows_invariant(model, memo=cache_dir() / "row-schemes")
        self._lock = threading.Lock()
        self._tokenizer_lock = threading.Lock()
        self.quantization: str | None = None
        self.compute = str(next(model.parameters()).dtype).removeprefix("torch.")
        self.weight_bytes = weight_bytes(model)

    # ------------------------------------------------------------------ loading

    @classmethod
    def load(
        cls,
        path: str | Path,
        *,
        name: str,
        device: str = "auto",
        dtype: str = "auto",
        cache_entries: int = 16,
        cache_tokens: int = 32768,
        adapter: str | Path | None = None,
        compute: str | None = None,
    ) -> TorchBackend:
        """``compute`` picks the decoder linears' working weights: ``stored`` (as the checkpoint
        has them; a quantized artifact decodes per forward), ``int8`` (per-channel int8 weights,
        SmoothQuant-scaled, per-token int8 activations on the VNNI units), ``fp8`` (E4M3
        weights and per-token activations on a GPU's fp8 tensor cores), ``bfloat16`` /
        ``float32`` / ``float16`` (that dtype, decoded once); None: the artifact's recorded
        choice, else ``auto`` (a quantized artifact decoded once into the model's dtype, a float
        checkpoint as it is)."""
        family = check_family(Path(path) / "config.json")
        dev = pick_device(device)
        quantization = read_quantization(path)
        if compute is None:
            compute = (quantization or {}).get("compute", "auto")
        if compute in ("float32", "bfloat16", "float16"):
            dtype = compute  # the float working weights are the model's dtype
        torch_dtype = pick_dtype(dtype, dev)
        # a float checkpoint runs as stored unless int8 is asked for by name
        working = (resolve_compute(compute, dev) if quantization or compute in ("int8", "fp8")
                   else "float")
        # Gemma 2 caps attention logits, which only the eager kernel implements.
        attn = "eager" if family == "gemma2" else "sdpa"
        tokenizer = AutoTokenizer.from_pretrained(path)
        if quantization is None:
            model = AutoModelForCausalLM.from_pretrained(
                path, dtype=torch_dtype, attn_implementation=attn
            )
        elif adapter is not None:
            raise QuantizeError(
                f"{path} is quantized ({quantization['scheme']}): an adapter cannot be merged "
                "into quantized weights; quantize with it instead (onepass quantize --adapter)"
            )
        else:
            # int8 is smoothed from activation statistics: measure them on the stored weights
            model = load_quantized(path, quantization, dtype=torch_dtype, attn=attn,
                                   compute="stored" if working == "int8" else working)
        model = model.to(dev)
        if adapter is not None:
            from onepass.adapters import apply_adapter

            model = apply_adapter(model, adapter)
        if working == "int8":
            from onepass.quant.smooth import activation_maxima, calibration_ids

            maxima = activation_maxima(model, working_candidates(model),
                                       calibration_ids(tokenizer))
            to_working_weights(model, "int8", torch_dtype, maxima=maxima)
        elif working == "fp8" and not quantization:
            to_working_weights(model, "fp8", torch_dtype)
        backend = cls(
            model, tokenizer, name=name, cache_entries=cache_entries, cache_tokens=cache_tokens
        )
        backend.compute = {"float": str(torch_dtype).removeprefix("torch.")}.get(working, working)
        if quantization:
            backend.quantization = quantization["scheme"]
            if working == "stored" and quantization["scheme"] != "int8":
                backend.merge_pairs = 4 * MERGE_PAIRS  # every pass re-decodes the weights
        return backend

    # ------------------------------------------------------------------ tokenizer

    def encode(self, text: str, *, bos: bool = True) -> list[int]:
        with self._tokenizer_lock:  # the Rust tokenizer refuses concurrent borrows
            ids = self.tokenizer(text, add_special_tokens=False)["input_ids"]
        if bos and self.bos_id is not None and (not ids or ids[0] != self.bos_id):
            ids = [self.bos_id, *ids]
        return list(ids)

    def decode(self, ids: Sequence[int]) -> str:
        return self.tokenizer.decode(list(ids))

    def render_chat(self, messages: list[dict[str, str]], **template_kwargs: Any) -> str:
        """``template_kwargs``: more variables for the template (a request's
        ``chat_template_kwargs``)."""
        return self.tokenizer.apply_chat_template(
            messages, tokenize=False, add_generation_prompt=True, **template_kwargs
        )

    # ------------------------------------------------------------------ forward passes

    def _forward(
        self,
        ids: Sequence[int],
        positions: torch.Tensor,
        past: KV | DynamicCache | None,
        mask: Any = None,
        segments: Segments | None = None,
    ) -> tuple[torch.Tensor, KV]:
        """One forward over ``ids`` on top of ``past`` (stored key/values, or a cache object
        that grows in place). On the invariant attention, ``segments`` (default: one causal
        sequence, ``ids`` following ``past``) says which keys each query reads; on an eager
        model, ``mask`` does."""
        cache = past if isinstance(past, DynamicCache) else (
            DynamicCache(ddp_cache_data=past) if past else DynamicCache())
        extra: dict[str, Any] = {}
        if self._segmented:
            if segments is None:
                keys = torch.arange(cache.get_seq_length() + len(ids))
                segments = Segments([Segment.causal(0, keys, positions)])
            extra["onepass_segments"] = segments
        out = self.decoder(
            input_ids=torch.tensor([list(ids)], device=self.device),
            position_ids=positions[None].to(self.device),
            attention_mask=mask,
            cache=cache,
            use_cache=True,
            **extra,
        )
        kv = tuple((layer.keys, layer.values) for layer in cache.layers)
        return out.last_hidden_state[0], kv

    def _prefix_kv(self, prefix: Sequence[int]) -> tuple[KV | None, int]:
        """The prefix's key/values, from the cache or computed on top of a cached part."""
        if not prefix:
            return None, 0
        cached_len, kv = self.cache.longest_prefix(prefix)
        return self._extend(prefix, cached_len, kv), cached_len

    def _extend(self, prefix: Sequence[int], cached_len: int, kv: KV | None,
                namespace: str | None = None) -> KV | None:
        """Compute the uncached rest of ``prefix`` on top of ``kv`` and cache the whole."""
        if cached_len < len(prefix):
            positions = torch.arange(cached_len, len(prefix))
            _, kv = self._forward(prefix[cached_len:], positions, kv)
            self.cache.put(prefix, kv, namespace)
        return kv

    def _suffix_segments(self, prefix_len: int, lengths: Sequence[int],
                         fresh: int = 0) -> Segments | None:
        """Attention groups of one packed forward: the ``fresh`` prefix tokens (not cached
        yet) attend to the prefix causally, each suffix to the whole prefix and itself, its
        keys in position order (a suffix's own rows follow the suffixes before it). None on an
        eager model (a dense mask)."""
        if not self._segmented:
            return None
        prefix_keys = torch.arange(prefix_len)
        items = []
        if fresh:
            items.append(Segment.causal(0, prefix_keys, torch.arange(prefix_len - fresh,
                                                                     prefix_len)))
        lo = fresh
        for n in lengths:
            own = prefix_len + lo - fresh + torch.arange(n)
            items.append(Segment.causal(lo, torch.cat([prefix_keys, own]),
                                        prefix_len + torch.arange(n)))
            lo += n
        return Segments(items)

    @staticmethod
    def _packed_positions(prefix_len: int, lengths: Sequence[int], fresh: int) -> torch.Tensor:
        offsets = torch.cat([torch.arange(n) for n in lengths])
        return torch.cat([torch.arange(prefix_len - fresh, prefix_len), prefix_len + offsets])

    def _packed_mask(
        self, prefix_len: int, lengths: Sequence[int], fresh: int = 0
    ) -> tuple[Any, torch.Tensor]:
        """Masks (per layer type) and positions for one packed forward: the last ``fresh``
        prefix tokens (not cached yet; causal among themselves) followed by the suffixes, each
        seeing the whole prefix and itself only."""
        block = torch.repeat_interleave(torch.arange(len(lengths)), torch.tensor(lengths))
        past = prefix_len - fresh
        positions = self._packed_positions(prefix_len, lengths, fresh)
        owner = torch.cat([torch.full((fresh,), -1), block])  # -1: a prefix token
        visible = ((owner[None, :] == -1) | (owner[None, :] == owner[:, None])) & (
            positions[None, :] <= positions[:, None]
        )
        allowed = torch.cat([torch.ones(len(owner), past, dtype=torch.bool), visible], dim=1)
        key_pos = torch.cat([torch.arange(past), positions])
        return self._layer_masks(allowed, key_pos, positions), positions

    def _head_rows(self, index: torch.Tensor | None = None) -> torch.Tensor:
        """Float32 output-head rows ``index`` (all rows for None); a stored table decodes only
        those."""
        rows = getattr(self.lm_head, "rows", None)
        if rows is not None:
            return rows(torch.arange(self.vocab_size) if index is None else index)
        weight = self.lm_head.weight
        return (weight if index is None else weight[index]).float()

    def _candidate_logits(
        self, hidden: torch.Tensor, candidates: Sequence[Sequence[int]]
    ) -> list[list[float]]:
        """Project each row only onto its candidates' output rows (not the whole vocabulary);
        a pseudo-candidate (:data:`VOCAB_LOGSUMEXP`, :data:`VOCAB_MAX`) projects the row onto
        the whole vocabulary once and reads that statistic of it."""
        bias = getattr(self.lm_head, "bias", None)
        out = []
        for row, ids in zip(hidden, candidates):
            tokens = [i for i in ids if i >= 0]
            index = torch.tensor(tokens, device=self.device, dtype=torch.long)
            logits = _dot_rows(self._head_rows(index), row)
            if bias is not None:
                logits = logits + bias[index].float()
            if self.softcap:
                logits = torch.tanh(logits / self.softcap) * self.softcap
            values = iter(logits.tolist())
            stats = self._vocab_stats(row) if len(tokens) < len(ids) else {}
            out.append([stats[i] if i < 0 else next(values) for i in ids])
        return out

    def _full_row(self, hidden: torch.Tensor) -> torch.Tensor:
        """``hidden``'s float32 logits over the whole vocabulary, in 8192-row chunks."""
        row = torch.cat([_dot_rows(self._head_rows(torch.arange(lo, min(lo + 8192,
                                                                  self.vocab_size))), hidden)
                         for lo in range(0, self.vocab_size, 8192)])
        bias = getattr(self.lm_head, "bias", None)
        if bias is not None:
            row = row + bias.float()
        if self.softcap:
            row = torch.tanh(row / self.softcap) * self.softcap
        return row

    def _vocab_stats(self, hidden: torch.Tensor) -> dict[int, float]:
        row = self._full_row(hidden)
        return {VOCAB_LOGSUMEXP: torch.logsumexp(row, 0).item(), VOCAB_MAX: row.max().item()}

    # ------------------------------------------------------------------ protocol

    @torch.inference_mode()
    def prefill(self, prefix: Sequence[int]) -> int:
        with self._lock:
            _, cached = self._prefix_kv(prefix)
            return cached

    @torch.inference_mode()
    def pin(self, prefix: Sequence[int]) -> None:
        """Compute ``prefix`` once and keep it resident outside the LRU (system context)."""
        with self._lock:
            kv, _ = self._prefix_kv(prefix)
            if kv is not None:
                self.cache.pin(prefix, kv)

    @torch.inference_mode()
    def score(
        self,
        prefix: Sequence[int],
        suffixes: Sequence[Sequence[int]],
        candidates: Sequence[Sequence[int]],
        *,
        namespace: str | None = None,
    ) -> ScoreResult:
        """``namespace``: the prefix-cache partition the prefix is looked up in and stored
        under (see :class:`~onepass.cache.PrefixCache`)."""
        if not has_work(suffixes, candidates):
            return ScoreResult([], 0)
        logits: list[list[float]] = []
        with self._lock:
            groups = packing_groups([len(s) for s in suffixes], self.max_packed_tokens)
            cached, kv = self.cache.longest_prefix(prefix, namespace) if prefix else (0, None)
            fresh = list(prefix[cached:])
            written = len(fresh) if self.cache.enabled \
                and len(prefix) <= self.cache.max_tokens else 0  # what put() below stores
            first = sum(len(suffixes[i]) for i in groups[0])
            too_big = len(fresh) + first > self.max_packed_tokens
            if too_big or len(fresh) * first > self.merge_pairs:  # the prefix's own forward
                kv, fresh = self._extend(prefix, cached, kv, namespace), []
            for group in groups:
                # On a miss the uncached prefix rides in the first packed forward (one pass
                # over the weights instead of two); its key/values are cached from there.
                lengths = [len(suffixes[i]) for i in group]
                segments = self._suffix_segments(len(prefix), lengths, len(fresh))
                if segments is None:
                    mask, positions = self._packed_mask(len(prefix), lengths, len(fresh))
                else:
                    mask, positions = None, self._packed_positions(len(prefix), lengths,
                                                                   len(fresh))
                packed = fresh + [t for i in group for t in suffixes[i]]
                hidden, out_kv = self._forward(packed, positions, kv, mask, segments)
                if fresh:
                    kv = tuple((k[:, :, : len(prefix)].clone(), v[:, :, : len(prefix)].clone())
                               for k, v in out_kv)
                    self.cache.put(prefix, kv, namespace)
                ends = (len(fresh) + torch.tensor(lengths).cumsum(0) - 1).to(hidden.device)
                logits += self._candidate_logits(hidden[ends], [candidates[i] for i in group])
                fresh = []
        return ScoreResult(logits, cached, written)

    @torch.inference_mode()
    def reference_logits(self, tokens: Sequence[int], candidates: Sequence[int]) -> list[float]:
        """The naive path: one plain full forward of the whole prompt, full-vocabulary logits.

        Used by tests and benchmarks to prove the fast path reads the same numbers.
        """
        with self._lock:
            hidden = self._forward(tokens, torch.arange(len(tokens)), None)[0][-1]
            # the full vocabulary, projected in float32 like the fast path's candidate rows
            # (in bfloat16 the model's own head would round logits to ~3 digits)
            row = self._full_row(hidden)
            stats = {VOCAB_LOGSUMEXP: torch.logsumexp(row, 0).item(),
                     VOCAB_MAX: row.max().item()}
            return [stats[i] if i < 0 else row[i].item() for i in candidates]

    def cache_stats(self) -> CacheStats:
        return self.cache.stats()

    # ------------------------------------------------------------------ generation

    @property
    def context_length(self) -> int:
        """The longest sequence (prompt + output) the model was trained for."""
        return int(getattr(self.config, "max_position_embeddings", 0) or 2048)

    @property
    def vocab_size(self) -> int:
        return int(self.lm_head.out_features)

    @property
    def special_ids(self) -> frozenset[int]:
        """Every special token: a greedy open value ends at the first one (not returned)."""
        return frozenset(self.tokenizer.all_special_ids)

    @property
    def eos_ids(self) -> frozenset[int]:
        """Tokens that end a generation: the tokenizer's EOS, the generation config's (chat
        models list their end-of-turn token there) and the chat template's end-of-turn."""
        ids: set[int] = set()
        gen = getattr(self.model, "generation_config", None)
        for value in (getattr(gen, "eos_token_id", None), self.tokenizer.eos_token_id):
            if isinstance(value, int):
                ids.add(value)
            elif value:
                ids.update(int(v) for v in value)
        for token in ("<|im_end|>", "<end_of_turn>", "<|eot_id|>", "<|endoftext|>"):
            tid = self.tokenizer.convert_tokens_to_ids(token)
            if isinstance(tid, int) and tid != self.tokenizer.unk_token_id and tid >= 0:
                ids.add(tid)
        return frozenset(ids)

    @torch.inference_mode()
    def prompt_logprobs(
        self, tokens: Sequence[int], top: int = 0
    ) -> list[tuple[float, tuple[tuple[int, float], ...]]]:
        """Log-probability of each prompt token after the ones before it (from the second
        token on), with the ``top`` most likely alternatives, from ONE whole forward under the
        lock: the reference for :meth:`scoring_reader`, which the server runs in step chunks
        (/v1/completions echo + logprobs)."""
        scoring = self.scoring_reader(tokens, top)
        scoring.take(0, 0, self._whole_hidden(tokens))
        return scoring.result()

    def scoring_reader(self, tokens: Sequence[int], top: int = 0) -> PromptScoring:
        """Prompt scoring as a reader the step scheduler feeds chunk by chunk."""
        return PromptScoring(self, tokens, top)

    def embedding_reader(self, inputs: Sequence[Sequence[int]]) -> MeanPooling:
        """Embeddings of ``inputs`` as a reader the step scheduler feeds chunk by chunk."""
        return MeanPooling(inputs, self.bos_id)

    def _whole_hidden(self, ids: Sequence[int]) -> torch.Tensor:
        """Final hidden states of ``ids`` from one forward without a cache (the reference
        path of the readers)."""
        if not ids:
            raise ValueError("a forward needs at least one token")
        with self._lock:
            return self._forward(ids, torch.arange(len(ids)), None)[0]

    def new_arena(self, capacity: int) -> KVArena:
        return KVArena(capacity)

    @torch.inference_mode()
    def load_prefix(self, arena: KVArena, table: list[int], owner: int,
                    prompt: Sequence[int], *, keep_last: bool = True,
                    namespace: str | None = None) -> int:
        """Copy the longest cached prefix of ``prompt`` (in ``namespace``) into the sequence's
        rows; returns its length. With ``keep_last`` the prompt's last token is always left to
        compute (a generation needs its logits, and the cache keeps keys/values, not
        logits)."""
        with self._lock:
            cached, kv = self.cache.longest_prefix(prompt, namespace) if prompt else (0, None)
            if keep_last:
                cached = min(cached, len(prompt) - 1)
            if cached > 0 and kv is not None:
                arena.grow(table, cached)
                arena.write(table, owner, [(k[:, :, :cached], v[:, :, :cached]) for k, v in kv])
            return cached

    @torch.inference_mode()
    def store_prefix(self, arena: KVArena, table: Sequence[int], prompt: Sequence[int], *,
                     namespace: str | None = None) -> bool:
        """Cache the prompt's keys/values (a copy: the arena's rows are reused later) in
        ``namespace``; False when the cache does not take it."""
        with self._lock:
            if self.cache.enabled and len(prompt) <= self.cache.max_tokens:  # else put drops it
                return self.cache.put(prompt, arena.read(table, len(prompt)), namespace)
            return False

    @torch.inference_mode()
    def step(self, arena: KVArena, rows: Sequence[StepRow]) -> list[torch.Tensor | None]:
        """ONE forward over the next tokens of several sequences living in ``arena``.

        Row ``i`` writes ``rows[i].tokens`` at positions ``start, start+1, ...`` of its owner;
        each query sees its own owner's rows (and its ``parent``'s: a decision suffix sees its
        shared prefix) up to its own position, within the sliding window on local-attention
        layers. Returns, per row that asks, the final hidden state at its last token (project
        it with :meth:`vocab_logits` or :meth:`candidate_logits`), or, for an ``every`` row,
        those of all its tokens.
        """
        ids = [t for r in rows for t in r.tokens]
        if not ids:
            return [None] * len(rows)
        with self._lock:
            def per_token(value: Any) -> torch.Tensor:
                return torch.cat([torch.full((len(r.tokens),), value(r)) for r in rows])

            positions = torch.cat([torch.arange(r.start, r.start + len(r.tokens)) for r in rows])
            owners = per_token(lambda r: r.owner)
            for r in rows:  # a decision suffix's own blocks start where its prefix ends
                arena.grow(r.table, r.start + len(r.tokens),
                           holes_below=r.start if r.parent is not None else 0)
            slots = torch.cat([arena.slots(r.table, r.start, len(r.tokens)) for r in rows])
            arena.claim(slots, owners, positions)
            # only rows of this step's owners (and parents) matter: the span ends at their
            # highest block
            span = max((max(t) + 1) * arena.block for r in rows for t in (r.table, r.parent_table)
                       if t)
            arena.prepare(span)
            extra: dict[str, Any] = {}
            mask = None
            if self._segmented:
                extra["onepass_segments"] = self._segments(arena, rows)
            else:  # eager attention: one dense mask over the span
                key_owner, key_pos = arena.owner[:span], arena.position[:span]
                parents = per_token(lambda r: r.owner if r.parent is None else r.parent)
                visible = (key_owner[None, :] == owners[:, None]) | (
                    key_owner[None, :] == parents[:, None]
                )
                allowed = visible & (key_pos[None, :] <= positions[:, None])
                mask = self._layer_masks(allowed, key_pos, positions)
            out = self.decoder(
                input_ids=torch.tensor([ids], device=self.device),
                position_ids=positions[None].to(self.device),
                attention_mask=mask,
                cache=ArenaCache(arena, slots.to(self.device), span),
                use_cache=True,
                **extra,
            )
            hidden = out.last_hidden_state[0]
            ends = torch.tensor([len(r.tokens) for r in rows]).cumsum(0).tolist()
            return [hidden[e - len(r.tokens):e] if r.every else hidden[e - 1] if r.logits
                    else None for r, e in zip(rows, ends)]

    def _segments(self, arena: KVArena, rows: Sequence[StepRow]) -> Segments:
        """One group per row (a sequence's tokens, a decision's prefix chunk, or one decision
        suffix, which reads its parent's rows and its own): the arena rows of positions 0 up
        to its last token, in position order."""
        items = []
        lo = 0
        for r in rows:
            end = r.start + len(r.tokens)
            candidates = torch.cat([arena.block_rows(t) for t in (r.parent_table, r.table) if t])
            owner = arena.owner[candidates]
            mine = (owner == r.owner) | (owner == (r.owner if r.parent is None else r.parent))
            found = candidates[mine & (arena.position[candidates] < end)]
            keys = found[torch.argsort(arena.position[found])]
            if not torch.equal(arena.position[keys], torch.arange(end)):
                raise RuntimeError(f"sequence {r.owner}: positions 0..{end - 1} are not all "
                                   "in the arena")
            items.append(Segment.causal(lo, keys, torch.arange(r.start, end), r.decode))
            lo += len(r.tokens)
        return Segments(items)

    @torch.inference_mode()
    def vocab_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Float32 full-vocabulary logits of final hidden states (rows)."""
        logits = self.lm_head(hidden).float()
        if self.softcap:
            logits = torch.tanh(logits / self.softcap) * self.softcap
        return logits

    @torch.inference_mode()
    def candidate_logits(
        self, hidden: torch.Tensor, candidates: Sequence[Sequence[int]]
    ) -> list[list[float]]:
        """Logits of each row's candidate tokens only (the decision readout)."""
        return self._candidate_logits(hidden, candidates)

    def _layer_masks(
        self, allowed: torch.Tensor, key_pos: torch.Tensor, query_pos: torch.Tensor
    ) -> Any:
        """The 4-D additive mask(s) an eager decoder takes: one per layer type on
        mixed-attention models; a key is visible while less than ``window`` positions back."""
        dtype = self.decoder.dtype if hasattr(self.decoder, "dtype") else torch.float32

        def build(window: int | None) -> torch.Tensor:
            ok = allowed if window is None else allowed & (
                key_pos[None, :] > query_pos[:, None] - window
            )
            mask = torch.zeros(ok.shape, dtype=dtype)
            mask.masked_fill_(~ok, torch.finfo(dtype).min)
            return mask[None, None].to(self.device)

        if self.layer_types:
            return {
                kind: build(self.window if kind == "sliding_attention" else None)
                for kind in set(self.layer_types)
            }
        return build(self.window)

    def render_chat_tools(self, messages: list[dict[str, Any]],
                          tools: list[dict[str, Any]] | None, **template_kwargs: Any) -> str:
        """The chat template with ``tools`` (for templates that declare them): an open
        assistant turn at the end, exactly like :meth:`render_chat`."""
        return self.tokenizer.apply_chat_template(
            messages, tools=tools or None, tokenize=False, add_generation_prompt=True,
            **template_kwargs,
        )

    @torch.inference_mode()
    def embed(self, ids: Sequence[int]) -> list[float]:
        """One sentence vector from ONE whole forward (see :class:`MeanPooling`): the reference
        for :meth:`embedding_reader`, which the server runs in step chunks."""
        pooling = self.embedding_reader([ids])
        pooling.take(0, 0, self._whole_hidden(ids))
        return pooling.result()[0]


class MeanPooling:
    """Sentence vectors of several inputs: the mean of the decoder's final hidden states over
    each input's tokens (a leading BOS, an attention sink with a huge norm, is left out), in
    float32. Fed in chunks (:meth:`take`), it keeps one running sum per input, never an
    input's whole hidden matrix. A decoder is not trained for this; it ranks paraphrases, it
    is no retrieval model."""

    def __init__(self, inputs: Sequence[Sequence[int]], bos: int | None):
        self.inputs = [list(x) for x in inputs]
        if not all(self.inputs):
            raise ValueError("embed needs at least one token per input")
        self._bos = bos
        self._sums: list[Any] = [None] * len(self.inputs)
        self._counts = [0] * len(self.inputs)

    def take(self, i: int, start: int, hidden: torch.Tensor) -> None:
        """The final hidden states of input ``i``'s tokens from position ``start`` on."""
        ids = self.inputs[i]
        if start == 0 and self._bos is not None and ids[0] == self._bos and len(ids) > 1:
            hidden = hidden[1:]
        total = hidden.float().sum(dim=0)
        previous = self._sums[i]
        self._sums[i] = total if previous is None else previous + total
        self._counts[i] += len(hidden)

    def result(self) -> list[list[float]]:
        return [(s / n).cpu().tolist() for s, n in zip(self._sums, self._counts)]


class PromptScoring:
    """Log-probability of each prompt token after the ones before it (from the second token
    on), with the ``top`` most likely alternatives: the scoring path of /v1/completions (echo +
    logprobs). Each chunk of hidden states is projected at once, in slices of ``rows``, so a
    long prompt never holds a prompt x vocabulary matrix."""

    def __init__(self, backend: TorchBackend, tokens: Sequence[int], top: int, rows: int = 256):
        self.inputs = [list(tokens)]
        self._backend = backend
        self._top = top
        self._rows = rows
        self._out: list[tuple[float, tuple[tuple[int, float], ...]]] = []

    @torch.inference_mode()
    def take(self, i: int, start: int, hidden: torch.Tensor) -> None:
        """The final hidden states at positions ``start, ...``: position p scores token p+1."""
        tokens = self.inputs[0]
        end = min(start + len(hidden), len(tokens) - 1)  # the last position scores nothing
        for lo in range(start, end, self._rows):
            hi = min(lo + self._rows, end)
            logp = torch.log_softmax(self._backend.vocab_logits(hidden[lo - start:hi - start]),
                                     -1)
            nxt = torch.tensor(tokens[lo + 1:hi + 1], device=logp.device)
            chosen = logp.gather(1, nxt[:, None])[:, 0].tolist()
            if self._top:
                values, best = torch.topk(logp, min(self._top, logp.shape[1]))
                alts = [tuple(zip(b, v)) for b, v in zip(best.tolist(), values.tolist())]
            else:
                alts = [()] * len(chosen)
            self._out.extend(zip(chosen, alts))

    def result(self) -> list[tuple[float, tuple[tuple[int, float], ...]]]:
        return self._out


def _dot_rows(rows: torch.Tensor, hidden: torch.Tensor) -> torch.Tensor:
    """``rows @ hidden`` in float32 with one summation order for every row, however many rows
    are asked for (a BLAS matrix-vector product picks kernels by row count: 1 and 3 candidate
    rows read other last digits than the full vocabulary does)."""
    return (rows * hidden.float()).sum(-1)


def packing_groups(lengths: Sequence[int], budget: int) -> list[list[int]]:
    """Consecutive groups of suffix indices whose packed length stays within ``budget``.

    Usually one group: every suffix in one forward. A huge request is split so the mask and
    activations stay bounded; a single suffix longer than the budget forms its own group.
    """
    groups: list[list[int]] = []
    total = 0
    for i, n in enumerate(lengths):
        if groups and total + n <= budget:
            groups[-1].append(i)
            total += n
        else:
            groups.append([i])
            total = n
    return groups


def _added_special(tokenizer: Any) -> set[str]:
    decoder = getattr(tokenizer, "added_tokens_decoder", {}) or {}
    return {str(tok.content) for tok in decoder.values() if getattr(tok, "special", False)}
