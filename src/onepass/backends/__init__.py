"""Backends turn token ids into candidate-label logits; the engine talks only to the protocol."""

from onepass.backends.base import Backend, ScoreResult

__all__ = ["Backend", "ScoreResult"]
