"""The library refuses a temperature that is no temperature, as the CLI and the wire do: nan
passes a ``<= 0`` check and would turn every answer into a 500 later."""

import math

import pytest

from onepass import DecisionEngine


@pytest.mark.parametrize("bad", [0.0, -1.0, math.nan, math.inf])
def test_engine_temperature_must_be_finite_and_positive(engine, bad):
    with pytest.raises(ValueError, match="finite number > 0"):
        DecisionEngine(engine.backend, temperature=bad)
