"""Sampling parameters without a model: `SamplingParams` checks every field when it is built
(type and range; booleans, NaN and infinities refused; nothing clamped) and raises
`ContractError` naming the field; `check_vocab` adds the one check that needs the vocabulary
size. Pure (no torch), so the server's request models import it; `sampling.py` is the sampler
that runs these parameters over a logits row.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from onepass.contract import ContractError, _describe, check_integer
from onepass.limits import check_vocabulary

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
    check_vocabulary(prefix + "logit_bias", (token for token, _ in params.logit_bias), vocab_size)


def _check_float(name: str, value: Any) -> None:
    low, high, low_excluded = _FLOATS[name]
    want = f"a number in {'(' if low_excluded else '['}{low:g}, {high:g}]"
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ContractError(name, f"expected {want}, got {_describe(value)}")
    # NaN fails both comparisons, infinities fail one: no separate finiteness test needed
    if not ((low < value <= high) if low_excluded else (low <= value <= high)):
        raise ContractError(name, f"expected {want}, got {value!r}")


def _check_int(name: str, value: Any) -> None:
    check_integer(name, value, *_INTS[name])


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
