"""The sampler: validated `SamplingParams` and one pipeline of pure functions over a logits row.

One order for every request; a stage whose parameter is at its neutral value is skipped:

    logit bias → penalties (repetition, presence, frequency) → grammar mask → temperature
      → top-k → top-p → min-p → typical → draw

Temperature 0 is greedy: the argmax after bias, penalties and mask (the filters never remove
the argmax, except typical, which greedy ignores), and it consumes no randomness. The mask (a
boolean row from a grammar matcher, see `grammar.py`) comes after every stage that shifts
logits and before every stage that removes candidates, so a forbidden token is never chosen
whatever the bias, and it consumes no randomness either. Each stage takes a
1-D float logits row and returns a new one with removed tokens at -inf; the caller's tensor is
never written. Top-k also shrinks the row to its k survivors (their token ids kept aside), so
every later stage and the draw work over k entries instead of the whole vocabulary.

Reported log-probabilities are the model's own: `log_softmax` of the raw row before any stage
(vLLM's default), so they do not depend on the sampling parameters.

Validation needs no model: `SamplingParams` and `check_vocab` live in the pure `params.py`
(both re-exported here), which the server's request models import without torch.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch

from onepass.generate.params import _U64, SamplingParams, check_vocab  # noqa: F401  (re-exported)


def make_generator(seed: int | None, device: torch.device | str = "cpu") -> torch.Generator:
    """A request-local generator: seeded when asked (same seed, same draws), else from the OS."""
    if seed is None:
        seed = int.from_bytes(os.urandom(8), "little")
    generator = torch.Generator(device=device)
    generator.manual_seed(seed & _U64)
    return generator


class TokenHistory:
    """What the penalties read for one sequence, updated in O(1) per generated token.

    `output_counts` maps each generated token id to its count (presence and frequency penalties
    look at the output only). `context_ids` holds the distinct ids of prompt + output as a
    tensor (the repetition penalty looks at both). Call `add` with every drawn token.
    """

    def __init__(self, prompt_ids: Sequence[int], device: torch.device | str = "cpu"):
        self.output_counts: dict[int, int] = {}
        self._seen = set(prompt_ids)
        self._ids = torch.tensor(sorted(self._seen), dtype=torch.long, device=device)
        self._size = len(self._seen)

    def add(self, token: int) -> None:
        self.output_counts[token] = self.output_counts.get(token, 0) + 1
        if token in self._seen:
            return
        self._seen.add(token)
        if self._size == self._ids.numel():  # grow by doubling: appends stay amortised O(1)
            grown = torch.empty(max(16, 2 * self._size), dtype=torch.long, device=self._ids.device)
            grown[: self._size] = self._ids[: self._size]
            self._ids = grown
        self._ids[self._size] = token
        self._size += 1

    @property
    def context_ids(self) -> torch.Tensor:
        return self._ids[: self._size]


# --------------------------------------------------------------------------- the stages


def apply_logit_bias(logits: torch.Tensor, bias: Sequence[tuple[int, float]]) -> torch.Tensor:
    """Add each token's bias (OpenAI's logit_bias); -100 effectively bans, +100 forces."""
    if not bias:
        return logits
    ids = torch.tensor([t for t, _ in bias], dtype=torch.long, device=logits.device)
    values = torch.tensor([b for _, b in bias], dtype=logits.dtype, device=logits.device)
    return logits.index_add(0, ids, values)


def apply_penalties(
    logits: torch.Tensor,
    params: SamplingParams,
    output_counts: Mapping[int, int],
    context_ids: Sequence[int] | torch.Tensor,
) -> torch.Tensor:
    """vLLM's penalties, repetition first.

    Repetition (CTRL) over every id in `context_ids` (prompt + output): a positive logit is
    divided by the penalty, a negative one multiplied. Then over the output only: subtract
    frequency_penalty x count and presence_penalty once for each token generated at least once.
    """
    r = params.repetition_penalty
    if r != 1.0 and len(context_ids):
        ids = torch.as_tensor(context_ids, dtype=torch.long, device=logits.device)
        seen = logits[ids]  # duplicate ids all write the same value
        logits = logits.index_put((ids,), torch.where(seen > 0, seen / r, seen * r))
    presence, frequency = params.presence_penalty, params.frequency_penalty
    if (presence or frequency) and output_counts:
        ids = torch.tensor(list(output_counts), dtype=torch.long, device=logits.device)
        counts = torch.tensor(
            list(output_counts.values()), dtype=logits.dtype, device=logits.device
        )
        penalty = frequency * counts + presence * (counts > 0)
        logits = logits.index_put((ids,), logits[ids] - penalty)
    return logits


def apply_mask(logits: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """Keep only the tokens where ``mask`` is True (a grammar's allowed set); the rest -inf."""
    if mask is None:
        return logits
    return torch.where(mask, logits, -math.inf)


def apply_temperature(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """Divide by a positive temperature (0 never gets here: it is greedy).

    The row is first shifted so its max is 0: softmax ignores the shift, and at a small
    temperature no logit overflows and the top ones keep their float32 precision.
    """
    if temperature == 1.0:
        return logits
    return (logits - logits.max()) / temperature


def top_k_filter(logits: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The k largest logits (descending) and their indices; `(logits, None)` when off.

    Exactly k survive (ties at the edge are broken by `torch.topk`). The short row replaces
    the vocabulary row for every later stage; the indices map a draw back to a token id.
    """
    if k <= 0 or k >= logits.numel():
        return logits, None
    values, ids = torch.topk(logits, k)
    return values, ids


def top_p_filter(logits: torch.Tensor, top_p: float) -> torch.Tensor:
    """Nucleus: keep the fewest most likely tokens whose mass reaches top_p (at least one)."""
    if top_p >= 1.0:
        return logits
    probs = torch.softmax(logits, -1)
    return _keep_mass(logits, probs, probs, top_p)


def min_p_filter(logits: torch.Tensor, min_p: float) -> torch.Tensor:
    """Keep tokens with probability >= min_p x the top probability (in logit space: no softmax)."""
    if min_p <= 0.0:
        return logits
    floor = logits.max() + math.log(min_p)
    return logits.masked_fill(logits < floor, -math.inf)


def typical_filter(logits: torch.Tensor, typical_p: float) -> torch.Tensor:
    """Locally typical sampling (Meister et al.; as in transformers' TypicalLogitsWarper).

    Rank tokens by how close their surprisal is to the entropy and keep the fewest, closest
    first, whose mass reaches typical_p (at least one). The argmax may be removed.
    """
    if typical_p >= 1.0:
        return logits
    logp = torch.log_softmax(logits, -1)
    probs = logp.exp()
    entropy = -(probs * logp).nansum()  # -inf x 0 is NaN for removed tokens: skip them
    return _keep_mass(logits, probs, -(logp + entropy).abs(), typical_p)


def _keep_mass(
    logits: torch.Tensor, probs: torch.Tensor, scores: torch.Tensor, mass: float
) -> torch.Tensor:
    """Keep the fewest tokens, highest `scores` first, whose probability reaches `mass`.

    A token is kept when the mass ranked before it is < `mass`, so the first always is. Ranks
    only a top-256 window, then a top-2048 one, before sorting the whole row: on SmolLM2's own
    rows at temperature 1 a 0.9 nucleus fits in 256 tokens about 85% of the time, in 2048
    always, and a full sort of 49k entries costs about 20 top-256 windows.
    """
    n = logits.numel()
    for k in (min(n, 256), min(n, 2048), n):
        order = torch.topk(scores, k).indices
        p = probs[order]
        total = p.cumsum(0)
        if k == n or float(total[-1]) >= mass:
            break
    keep = order[(total - p) < mass]
    return torch.full_like(logits, -math.inf).index_copy_(0, keep, logits[keep])


def draw(logits: torch.Tensor, generator: torch.Generator | None = None) -> int:
    """One index from softmax(logits) by inverse CDF: one uniform number per draw.

    u is in (0, total], so the first index whose cumulative mass reaches u always exists and
    always has positive probability (a -inf token adds nothing and is never first to reach u).
    """
    cdf = torch.softmax(logits, -1).cumsum(0, dtype=torch.float64)
    u = 1.0 - torch.rand(1, dtype=torch.float64, generator=generator, device=logits.device)
    return int(torch.searchsorted(cdf, u * cdf[-1]))


# --------------------------------------------------------------------------- composition


@dataclass(frozen=True)
class Draw:
    """One sampled token and its log-probabilities under the model's raw distribution."""

    token: int
    logprob: float
    top: tuple[tuple[int, float], ...]  # the params.logprobs most likely (id, logprob), best first


def sample(
    logits: torch.Tensor,
    params: SamplingParams,
    output_counts: Mapping[int, int] | None = None,
    context_ids: Sequence[int] | torch.Tensor = (),
    generator: torch.Generator | None = None,
    mask: torch.Tensor | None = None,
) -> Draw:
    """Run the pipeline (module docstring) on one 1-D logits row and report the chosen token.

    `output_counts` and `context_ids` feed the penalties (a `TokenHistory` keeps both);
    `generator` comes from `make_generator` (None: torch's global generator); `mask` is a
    boolean row of the logits' length (True: allowed) with at least one allowed token.
    """
    raw = logits.float()
    x = apply_logit_bias(raw, params.logit_bias)
    x = apply_penalties(x, params, output_counts or {}, context_ids)
    x = apply_mask(x, mask)
    if params.greedy:
        token = int(torch.argmax(x))
    else:
        x = apply_temperature(x, params.temperature)
        x, ids = top_k_filter(x, params.top_k)
        x = top_p_filter(x, params.top_p)
        x = min_p_filter(x, params.min_p)
        x = typical_filter(x, params.typical_p)
        index = draw(x, generator)
        token = index if ids is None else int(ids[index])
    logp = torch.log_softmax(raw, -1)
    top: tuple[tuple[int, float], ...] = ()
    if params.logprobs:
        values, best = torch.topk(logp, min(params.logprobs, logp.numel()))
        top = tuple(zip(best.tolist(), values.tolist()))
    return Draw(token, float(logp[token]), top)
