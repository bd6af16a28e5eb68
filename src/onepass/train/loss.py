"""The training objective: restricted cross-entropy at the decision position.

The server reads the logits of the candidate labels at the last prompt position and applies a
softmax over those candidates only (:func:`onepass.readout.restricted_softmax`). The trainer
minimises exactly ``-log`` of the gold candidate's share of that softmax, computed from the
same hidden state and the same output rows (soft-capped like the backend does), so what is
optimised is what is served. Temperature is 1 during training. A question with a target
distribution instead of one gold candidate (distillation: a teacher's answer) is trained on the
cross-entropy against that distribution, the KL divergence from it plus its fixed entropy.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch


@dataclass
class Batch:
    """Right-padded prompts with their candidate labels, gold candidate index and target
    distribution over the candidates (one-hot at the gold one unless a soft target was given).

    With right padding and causal attention, no real token ever sees a pad token, so no
    attention mask is needed; ``last`` is each row's last real position.
    """

    input_ids: torch.Tensor  # [B, L]
    last: torch.Tensor  # [B]
    candidates: torch.Tensor  # [B, K] token ids, padded with 0
    candidate_mask: torch.Tensor  # [B, K] bool, True for real candidates
    targets: torch.Tensor  # [B] index of the gold candidate (a soft target's first argmax)
    distributions: torch.Tensor  # [B, K] float32 target probabilities, 0 on padded candidates

    @property
    def tokens(self) -> int:
        return int(self.last.sum().item()) + len(self.last)

    @classmethod
    def collate(
        cls,
        sequences: Sequence[Sequence[int]],
        candidates: Sequence[Sequence[int]],
        targets: Sequence[int],
        pad_id: int = 0,
        distributions: Sequence[Sequence[float] | None] | None = None,
    ) -> Batch:
        length = max(len(s) for s in sequences)
        width = max(len(c) for c in candidates)
        ids = torch.full((len(sequences), length), pad_id, dtype=torch.long)
        cand = torch.zeros((len(sequences), width), dtype=torch.long)
        mask = torch.zeros((len(sequences), width), dtype=torch.bool)
        dist = torch.zeros((len(sequences), width), dtype=torch.float32)
        soft = distributions or [None] * len(sequences)
        for i, (seq, cands, target, p) in enumerate(zip(sequences, candidates, targets, soft)):
            ids[i, : len(seq)] = torch.tensor(list(seq))
            cand[i, : len(cands)] = torch.tensor(list(cands))
            mask[i, : len(cands)] = True
            if p is None:
                dist[i, target] = 1.0
            else:
                dist[i, : len(cands)] = torch.tensor(list(p), dtype=torch.float32)
        return cls(
            ids,
            torch.tensor([len(s) - 1 for s in sequences]),
            cand,
            mask,
            torch.tensor(list(targets), dtype=torch.long),
            dist,
        )

    def to(self, device: torch.device) -> Batch:
        return Batch(*(t.to(device) for t in (
            self.input_ids, self.last, self.candidates, self.candidate_mask, self.targets,
            self.distributions)))


def final_softcap(model: Any) -> float | None:
    config = model.config.get_text_config(decoder=True)
    return getattr(config, "final_logit_softcapping", None)


def decision_logits(model: Any, batch: Batch) -> torch.Tensor:
    """Candidate logits at each row's last real position: ``[B, K]`` (float32).

    Runs the decoder only (no full-vocabulary logits) and projects the last hidden state onto
    the output rows of the candidates, as the serving backend does. Padded candidates get -inf.
    """
    decoder = model.get_decoder()
    head = model.get_output_embeddings()
    hidden = decoder(input_ids=batch.input_ids, use_cache=False).last_hidden_state
    rows = hidden[torch.arange(hidden.shape[0], device=hidden.device), batch.last]  # [B, H]
    with torch.autocast(hidden.device.type, enabled=False):  # the readout in float32
        weight = head.weight[batch.candidates]  # [B, K, H]
        logits = torch.einsum("bkh,bh->bk", weight.float(), rows.float())
        bias = getattr(head, "bias", None)
        if bias is not None:
            logits = logits + bias[batch.candidates].float()
        cap = final_softcap(model)
        if cap:
            logits = torch.tanh(logits / cap) * cap
        return logits.masked_fill(~batch.candidate_mask, float("-inf"))


def restricted_cross_entropy(
    logits: torch.Tensor, targets: torch.Tensor, reduction: str = "mean"
) -> torch.Tensor:
    """Cross-entropy over the candidates (padded ones are -inf): ``targets`` either the gold
    candidate's index per row (``[B]``, integers: ``-log softmax(logits)[target]``) or a target
    distribution per row (``[B, K]``, floats, 0 on padded candidates:
    ``-sum p log softmax(logits)``, which a one-hot row reads exactly as its index)."""
    if targets.is_floating_point():
        finite = logits.masked_fill(torch.isinf(logits), 0.0)
        losses = torch.logsumexp(logits, dim=-1) - (targets * finite).sum(dim=-1)
    else:
        losses = torch.logsumexp(logits, dim=-1) - logits.gather(1, targets[:, None])[:, 0]
    if reduction == "none":
        return losses
    if reduction == "sum":
        return losses.sum()
    return losses.mean()
