"""The one small protocol every backend implements."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from onepass.cache import CacheStats


@dataclass(frozen=True)
class ScoreResult:
    """Candidate logits per suffix, in the order the candidates were given.

    ``cached_tokens`` is how many prefix tokens came from the prefix cache instead of being
    computed for this call.
    """

    logits: list[list[float]]
    cached_tokens: int


def has_work(suffixes: Sequence[Sequence[int]], candidates: Sequence[Sequence[int]]) -> bool:
    """Check ``score``'s arguments (one candidate list per suffix, no empty suffix); False
    when there is nothing to score."""
    if len(suffixes) != len(candidates):
        raise ValueError("one candidate list per suffix is needed")
    if any(len(s) == 0 for s in suffixes):
        raise ValueError("every suffix needs at least one token")
    return bool(suffixes)


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
