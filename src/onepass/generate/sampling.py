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

Validation needs no model: `SamplingParams` checks every field when it is built (type and
range; booleans, NaN and infinities refused; nothing clamped) and raises `ContractError` naming
the field. `check_vocab` adds the one check that needs the vocabulary size.
"""

from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from onepass.contract import ContractError, _describe

MAX_STOPS = 4  # OpenAI's limit
MAX_STOP_CHARS = 256  # bounds the text a StopMatcher holds back and scans per token
MAX_LOGPROBS = 20  # OpenAI's top_logprobs limit
MAX_LOGIT_BIAS = 300  # OpenAI's limit on logit_bias entries
LOGIT_BIAS_RANGE = 100.0
MIN_TEMPERATURE = 1e-6  # below this a positive temperature is greedy in float32: send 0

# float fields: (low, high, low excluded); the high end is always included
_FLOATS: dict[str, tuple[float, float, bool]] = {
    "temperature": (0.0, 2.0, False),
    "top_p": (0.0, 1.0, True),
    "min_p": (0.0, 1.0, False),
    "typical_p": (0.0, 1.0, True),
    "presence_penalty": (-2.0, 2.0, False),
    "frequency_penalty": (-2.0, 2.0, False),
    "repetition_penalty": (0.0, 2.0, True),
}
# int fields: (low, high or None); both ends included
_INTS: dict[str, tuple[int, int | None]] = {
    "max_tokens": (0, None),
    "top_k": (0, None),
    "seed": (-(2**63), 2**63 - 1),
    "logprobs": (0, MAX_LOGPROBS),
}
_OPTIONAL = {"max_tokens", "seed", "logprobs"}
_U64 = 2**64 - 1


@dataclass(frozen=True)
class SamplingParams:
    """How to turn one logits row into one token, validated when built.

    Ranges: temperature 0 (greedy) or [1e-6, 2], top_p (0, 1], top_k >= 0 (0 = off), min_p [0, 1],
    typical_p (0, 1] (1 = off), presence/frequency penalty [-2, 2], repetition_penalty (0, 2]
    (1 = off), logit_bias values [-100, 100] (at most 300 tokens), at most 4 non-empty stop
    strings of at most 256 characters, logprobs [0, 20] (None = off), max_tokens >= 0 (None =
    the model's default; 0 scores the prompt only). `stop` also takes one string and
    `logit_bias` a mapping (string or int token ids); both are stored as tuples.
    """

    max_tokens: int | None = None
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    typical_p: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    logit_bias: tuple[tuple[int, float], ...] = ()
    seed: int | None = None
    stop: tuple[str, ...] = ()
    logprobs: int | None = None
    ignore_eos: bool = False

    def __post_init__(self) -> None:
        for name in _FLOATS:
            _check_float(name, getattr(self, name))
        if 0 < self.temperature < MIN_TEMPERATURE:
            raise ContractError(
                "temperature",
                f"expected 0 (greedy) or a number in [{MIN_TEMPERATURE:g}, 2], "
                f"got {self.temperature!r}",
            )
        for name in _INTS:
            if not (name in _OPTIONAL and getattr(self, name) is None):
                _check_int(name, getattr(self, name))
        if not isinstance(self.ignore_eos, bool):
            got = _describe(self.ignore_eos)
            raise ContractError("ignore_eos", f"expected a boolean, got {got}")
        object.__setattr__(self, "stop", _stops(self.stop))
        object.__setattr__(self, "logit_bias", _logit_bias(self.logit_bias))

    @classmethod
    def from_request(cls, fields: Mapping[str, Any], *, prefix: str = "") -> SamplingParams:
        """Build from raw JSON values under their OpenAI names; null or absent means default.

        Other keys are ignored (the routes pass the whole body). A bad value raises
        `ContractError` whose field is `prefix` + the OpenAI name.
        """
        given = {k: fields[k] for k in _FIELD_NAMES if fields.get(k) is not None}
        try:
            return cls(**given)
        except ContractError as err:
            raise ContractError(prefix + err.field, err.message, kind=err.kind) from None

    @property
    def greedy(self) -> bool:
        """Temperature 0: argmax after bias and penalties, no randomness."""
        return self.temperature == 0


_FIELD_NAMES = tuple(f.name for f in dataclasses.fields(SamplingParams))


def check_vocab(params: SamplingParams, vocab_size: int, *, prefix: str = "") -> None:
    """Refuse logit_bias token ids the model does not have (the one check needing the model)."""
    for token, _ in params.logit_bias:
        if token >= vocab_size:
            raise ContractError(
                prefix + "logit_bias",
                f"token id {token} is outside the vocabulary (ids 0..{vocab_size - 1})",
            )


def _check_float(name: str, value: Any) -> None:
    low, high, low_excluded = _FLOATS[name]
    want = f"a number in {'(' if low_excluded else '['}{low:g}, {high:g}]"
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ContractError(name, f"expected {want}, got {_describe(value)}")
    # NaN fails both comparisons, infinities fail one: no separate finiteness test needed
    if not ((low < value <= high) if low_excluded else (low <= value <= high)):
        raise ContractError(name, f"expected {want}, got {value!r}")


def _check_int(name: str, value: Any) -> None:
    low, high = _INTS[name]
    want = f"an integer >= {low}" if high is None else f"an integer in [{low}, {high}]"
    if isinstance(value, bool) or not isinstance(value, int):
        got = repr(value) if isinstance(value, float) else _describe(value)
        raise ContractError(name, f"expected {want}, got {got}")
    if value < low or (high is not None and value > high):
        raise ContractError(name, f"expected {want}, got {value}")


def _stops(value: Any) -> tuple[str, ...]:
    if isinstance(value, str):
        value = (value,)
    if not isinstance(value, (list, tuple)):
        raise ContractError(
            "stop", f"expected a string or an array of strings, got {_describe(value)}"
        )
    if len(value) > MAX_STOPS:
        raise ContractError("stop", f"expected at most {MAX_STOPS} stop strings, got {len(value)}")
    for item in value:
        if not isinstance(item, str) or not item:
            got = "an empty string" if item == "" else _describe(item)
            raise ContractError("stop", f"expected non-empty strings, got {got}")
        if len(item) > MAX_STOP_CHARS:
            raise ContractError(
                "stop", f"expected strings of at most {MAX_STOP_CHARS} characters, "
                f"got one of {len(item)}"
            )
    return tuple(value)


def _token_id(key: Any) -> int:
    if isinstance(key, int) and not isinstance(key, bool) and key >= 0:
        return key
    # at most 10 digits: every vocabulary fits, and int() never meets its 4,300-digit limit
    if isinstance(key, str) and key.isascii() and key.isdigit() and len(key) <= 10:
        return int(key)
    shown = repr(key) if not isinstance(key, str) or len(key) <= 20 else (
        f"a key of {len(key)} characters")
    raise ContractError(
        "logit_bias", "expected token ids as keys (decimal strings of at most 10 digits such "
        f"as \"50256\"), got {shown}"
    )


def _logit_bias(value: Any) -> tuple[tuple[int, float], ...]:
    if isinstance(value, Mapping):
        items = list(value.items())
    elif isinstance(value, (list, tuple)) and all(
        isinstance(p, (list, tuple)) and len(p) == 2 for p in value
    ):
        items = [tuple(p) for p in value]
    else:
        raise ContractError(
            "logit_bias", f"expected an object mapping token ids to biases, got {_describe(value)}"
        )
    if len(items) > MAX_LOGIT_BIAS:
        raise ContractError(
            "logit_bias", f"expected at most {MAX_LOGIT_BIAS} tokens, got {len(items)}"
        )
    out: dict[int, float] = {}
    for key, bias in items:
        token = _token_id(key)
        if isinstance(bias, bool) or not isinstance(bias, (int, float)):
            got = _describe(bias)
        elif not -LOGIT_BIAS_RANGE <= bias <= LOGIT_BIAS_RANGE:
            got = repr(bias)
        else:
            got = ""
        if got:
            raise ContractError(
                "logit_bias", f"expected a bias in [-100, 100] for token {key!r}, got {got}"
            )
        if token in out:
            raise ContractError("logit_bias", f"token id {token} appears more than once")
        out[token] = float(bias)
    return tuple(sorted(out.items()))


# --------------------------------------------------------------------------- per-sequence state


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
