"""onepass: typed decisions (noul, choice, score) from one forward pass of a language model."""

from onepass.contract import ContractError, DecisionRequest, parse_request
from onepass.engine import DecisionEngine

__all__ = ["ContractError", "DecisionEngine", "DecisionRequest", "parse_request"]
__version__ = "0.1.0"
