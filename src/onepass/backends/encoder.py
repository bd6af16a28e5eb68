"""Sentence embeddings from a trained encoder (a model served with ``task: embedding``).

A decoder's mean-pooled hidden states (``TorchBackend.embed``) rank paraphrases but are no
retrieval model; a sentence-transformers checkpoint is trained for exactly this. The encoder is
loaded with transformers (``AutoModel``) and pooled the way its sentence-transformers files say
(``1_Pooling/config.json``: mean or CLS; ``modules.json``: a ``Normalize`` step), in float32.
Nothing is truncated: an input longer than the checkpoint's sequence limit is refused.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from onepass.limits import ENCODER_LIMIT, too_long

BATCH_TOKENS = 8192  # padded tokens per forward: bounds memory whatever the batch


class InputTooLong(ValueError):
    """An input over the encoder's sequence limit; ``index`` is its place in the batch."""

    def __init__(self, index: int, tokens: int, limit: int):
        super().__init__(too_long(f"input[{index}]", tokens, limit, ENCODER_LIMIT,
                                  what=f"input[{index}]", advice="shorten the input").message)
        self.index, self.tokens, self.limit = index, tokens, limit


def _read_json(path: Path) -> Any:
    return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else None


def pooling_of(folder: Path) -> tuple[str, bool]:
    """(``mean`` | ``cls``, normalise?) from the sentence-transformers files; a plain
    transformers folder (no such files) gets mean pooling and normalisation."""
    modules = _read_json(folder / "modules.json") or []
    normalise = not modules or any(str(m.get("type", "")).endswith("Normalize")
                                   for m in modules)
    pooling_dir = next((m.get("path") for m in modules
                        if str(m.get("type", "")).endswith("Pooling")), "1_Pooling")
    config = _read_json(folder / pooling_dir / "config.json") or {}
    if config.get("pooling_mode_cls_token"):
        return "cls", normalise
    if any(config.get(k) for k in ("pooling_mode_max_tokens", "pooling_mode_mean_sqrt_len_tokens",
                                   "pooling_mode_weightedmean_tokens",
                                   "pooling_mode_lasttoken")):
        raise ValueError(f"{folder}: pooling {config} is not served (mean or CLS only)")
    return "mean", normalise


class SentenceEncoder:
    """Token ids → one float32 vector per input, pooled as the checkpoint was trained."""

    def __init__(self, folder: str | Path, *, device: str = "auto",
                 max_input_tokens: int | None = None):
        from transformers import AutoModel, AutoTokenizer

        from onepass.backends.torch import pick_device

        folder = Path(folder)
        self.device = pick_device(device)  # the same choice and check as the decoder's
        self.tokenizer = AutoTokenizer.from_pretrained(folder)
        self.model = AutoModel.from_pretrained(folder, dtype=torch.float32).to(self.device)
        self.model.eval()
        self.config = self.model.config
        self.pooling, self.normalise = pooling_of(folder)
        limits = [getattr(self.config, "max_position_embeddings", None),
                  (_read_json(folder / "sentence_bert_config.json") or {}).get("max_seq_length"),
                  max_input_tokens]
        model_max = getattr(self.tokenizer, "model_max_length", None)
        if isinstance(model_max, int) and model_max < 1_000_000:  # "unset" is ~1e30
            limits.append(model_max)
        self.max_tokens = min(int(x) for x in limits if x)
        self.dimensions = int(self.config.hidden_size)
        self.vocab_size = int(self.config.vocab_size)
        self.pad_id = self.tokenizer.pad_token_id or 0
        # the special tokens the tokenizer puts around one text ([CLS] … [SEP] for BERT)
        plain = self.tokenizer("a", add_special_tokens=False)["input_ids"]
        full = self.tokenizer("a", add_special_tokens=True)["input_ids"]
        at = next(i for i in range(len(full)) if full[i:i + len(plain)] == plain)
        self._prefix, self._suffix = full[:at], full[at + len(plain):]
        self.weight_bytes = sum(p.numel() * p.element_size() for p in self.model.parameters())
        self._lock = threading.Lock()

    def encode(self, text: str) -> list[int]:
        """The ids the checkpoint reads for ``text``, special tokens included (counted in
        usage)."""
        return self.tokenizer(text, add_special_tokens=True, truncation=False,
                              verbose=False)["input_ids"]

    def wrap(self, ids: Sequence[int]) -> list[int]:
        """Client-given token ids with the checkpoint's special tokens around them, as
        :meth:`encode` adds them to a text."""
        return [*self._prefix, *ids, *self._suffix]

    def check(self, batch: Sequence[Sequence[int]]) -> None:
        """Refuse (never truncate) an input over the limit; the first one found is named."""
        for i, ids in enumerate(batch):
            if len(ids) > self.max_tokens:
                raise InputTooLong(i, len(ids), self.max_tokens)

    @torch.inference_mode()
    def embed(self, batch: Sequence[Sequence[int]]) -> list[list[float]]:
        """One vector per input, in input order. Inputs are grouped by length (less padding)
        into forwards of at most :data:`BATCH_TOKENS` padded tokens; a padded position is
        masked out of attention and pooling, so a vector does not depend on its neighbours
        beyond float rounding (~1e-7)."""
        self.check(batch)
        order = sorted(range(len(batch)), key=lambda i: len(batch[i]))
        out: list[list[float] | None] = [None] * len(batch)
        start = 0
        while start < len(order):
            end = start + 1
            while end < len(order) and len(batch[order[end]]) * (end + 1 - start) <= BATCH_TOKENS:
                end += 1
            group = order[start:end]
            for i, vector in zip(group, self._forward([batch[i] for i in group])):
                out[i] = vector
            start = end
        return out  # type: ignore[return-value]

    def _forward(self, batch: list[Sequence[int]]) -> list[list[float]]:
        width = max(len(ids) for ids in batch)
        ids = torch.full((len(batch), width), self.pad_id, dtype=torch.long)
        mask = torch.zeros((len(batch), width), dtype=torch.long)
        for row, seq in enumerate(batch):
            ids[row, :len(seq)] = torch.tensor(list(seq), dtype=torch.long)
            mask[row, :len(seq)] = 1
        ids, mask = ids.to(self.device), mask.to(self.device)
        with self._lock:
            hidden = self.model(input_ids=ids, attention_mask=mask).last_hidden_state.float()
        if self.pooling == "cls":
            pooled = hidden[:, 0]
        else:
            weights = mask.unsqueeze(-1).to(hidden.dtype)
            pooled = (hidden * weights).sum(dim=1) / weights.sum(dim=1).clamp(min=1.0)
        if self.normalise:
            pooled = torch.nn.functional.normalize(pooled, p=2, dim=-1)
        return pooled.cpu().tolist()


@dataclass
class EmbeddingEngine:
    """A resident embedding model as the server keeps it: its served name, the encoder, and
    the per-model concurrency (it has its own queue, like every model)."""

    served_name: str
    backend: SentenceEncoder
    max_concurrency: int = 8
    task: str = "embedding"

    @property
    def max_input_tokens(self) -> int:
        """The longest input accepted (the checkpoint's limit, or a lower configured one)."""
        return self.backend.max_tokens

    @classmethod
    def from_pretrained(cls, model: str, *, served_name: str | None = None,
                        device: str = "auto", max_input_tokens: int | None = None,
                        max_concurrency: int = 8) -> EmbeddingEngine:
        """Load an :data:`onepass.models.ENCODERS` alias or a checkpoint directory."""
        from onepass.models import resolve_encoder

        resolved = resolve_encoder(model)
        encoder = SentenceEncoder(resolved.path, device=device, max_input_tokens=max_input_tokens)
        return cls(served_name or resolved.name, encoder, max_concurrency)
