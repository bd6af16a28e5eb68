"""onepass: typed decisions (noul, choice, score) from one forward pass of a language model."""

from onepass.contract import ContractError, DecisionRequest, parse_request
from onepass.engine import DecisionEngine, EngineConfig

__all__ = ["ContractError", "DecisionEngine", "DecisionRequest", "EngineConfig", "parse_request"]
__version__ = "0.1.0"
