"""Streams keep their pace: how many tokens of other work a step may carry while sequences decode.

A step's time grows with every token it carries. On a GPU a prompt chunk of hundreds of tokens
costs a decode step little; on a CPU each token costs about the same, so a step that also
computes a 130-token embedding took ~4x a decode-only step and every stream felt it between two
of its tokens. :class:`StepPace` keeps a running estimate of a decode-only step's time and of
the time one more token adds to it, and allows a step that carries decode tokens only as many
other tokens (decision prefixes and suffixes, prompt chunks, readings) as fit in
``(slowdown - 1)`` times a decode-only step. The other work still advances every step (at least
``floor`` tokens, and always one whole row: see the scheduler), so nothing starves; it runs at
full budget again as soon as no sequence decodes. Pure: the scheduler times its steps and reports.
"""

from __future__ import annotations

from dataclasses import dataclass

DEFAULT_STREAM_SLOWDOWN = 1.5


@dataclass
class StepPace:
    """Running estimates of a step's cost, and the allowance of other tokens they give.

    ``decode_seconds``: an exponential average of steps that carried decode tokens only.
    ``token_seconds``: what one more token adds, from steps that carried both (their time less
    ``decode_seconds``, per other token); before any such step, a prefill-only step's time per
    token, which overstates it (the step's fixed cost is in it) and so errs on the streams' side.
    """

    slowdown: float = DEFAULT_STREAM_SLOWDOWN
    floor: int = 8
    weight: float = 0.25  # of the newest step in each average
    decode_seconds: float | None = None
    token_seconds: float | None = None

    def __post_init__(self) -> None:
        if not self.slowdown > 1.0:
            raise ValueError(f"slowdown must be above 1.0, got {self.slowdown}")
        if self.floor < 1:
            raise ValueError(f"floor must be at least 1, got {self.floor}")

    def allowance(self, budget: int) -> int:
        """Other tokens a step with decode tokens may carry, within ``budget``."""
        if self.decode_seconds is None or self.token_seconds is None:
            return min(budget, self.floor)
        fits = (self.slowdown - 1.0) * self.decode_seconds / self.token_seconds
        return max(min(budget, self.floor), int(min(budget, fits)))  # a float may be inf

    def observe(self, decode_tokens: int, other_tokens: int, seconds: float) -> None:
        """Fold one step's time into the estimates."""
        if decode_tokens and not other_tokens:
            self.decode_seconds = self._average(self.decode_seconds, seconds)
        elif decode_tokens and self.decode_seconds is not None:
            added = max(seconds - self.decode_seconds, 0.0) / other_tokens
            self.token_seconds = self._average(self.token_seconds, max(added, 1e-6))
        elif not decode_tokens and other_tokens >= 4 * self.floor and self.token_seconds is None:
            self.token_seconds = seconds / other_tokens

    def _average(self, old: float | None, new: float) -> float:
        return new if old is None else (1.0 - self.weight) * old + self.weight * new
