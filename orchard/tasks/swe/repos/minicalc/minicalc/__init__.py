"""A tiny arithmetic expression language."""

from minicalc.errors import CalcError
from minicalc.evaluator import calculate, evaluate
from minicalc.parser import parse
from minicalc.tokenizer import tokenize

__all__ = ["CalcError", "calculate", "evaluate", "parse", "tokenize"]
