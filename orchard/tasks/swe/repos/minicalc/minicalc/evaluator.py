"""Evaluate parsed trees."""

from __future__ import annotations

import math
from collections.abc import Mapping

from minicalc.errors import CalcError
from minicalc.parser import parse

Number = int | float


def _round(value: Number, digits: Number = 0) -> Number:
    """Round half away from zero (not Python's banker's rounding)."""
    scale = 10 ** int(digits)
    rounded = math.floor(abs(value) * scale + 0.5) / scale
    result = rounded if value >= 0 else -rounded
    return int(result) if digits == 0 else result


def _sqrt(value: Number) -> float:
    if value < 0:
        raise CalcError("sqrt of a negative number")
    return math.sqrt(value)


FUNCTIONS = {
    "abs": (abs, 1, 1),
    "min": (min, 1, None),
    "max": (max, 1, None),
    "round": (_round, 1, 2),
    "sqrt": (_sqrt, 1, 1),
}


def _binary(op: str, left: Number, right: Number) -> Number | bool:
    if op == "+":
        return left + right
    if op == "-":
        return left - right
    if op == "*":
        return left * right
    if op in ("/", "//", "%") and right == 0:
        raise CalcError("division by zero")
    if op == "/":
        return left / right
    if op == "//":
        return left // right
    if op == "%":
        return left % right
    if op == "**":
        return left**right
    comparisons = {"<": left < right, "<=": left <= right, ">": left > right, ">=": left >= right,
                   "==": left == right, "!=": left != right}
    if op in comparisons:
        return comparisons[op]
    raise CalcError(f"unknown operator {op!r}")


def evaluate(tree: tuple, variables: Mapping[str, Number] | None = None) -> Number | bool:
    variables = variables or {}
    kind = tree[0]
    if kind == "num":
        return tree[1]
    if kind == "var":
        name = tree[1]
        if name not in variables:
            raise CalcError(f"undefined variable {name!r}")
        return variables[name]
    if kind == "neg":
        return -evaluate(tree[1], variables)
    if kind == "bin":
        _, op, left, right = tree
        return _binary(op, evaluate(left, variables), evaluate(right, variables))
    if kind == "call":
        _, name, args = tree
        if name not in FUNCTIONS:
            raise CalcError(f"unknown function {name!r}")
        function, least, most = FUNCTIONS[name]
        if len(args) < least or (most is not None and len(args) > most):
            raise CalcError(f"{name}() takes {least}..{most or 'any'} arguments, got {len(args)}")
        return function(*(evaluate(arg, variables) for arg in args))
    raise CalcError(f"unknown node {kind!r}")


def calculate(source: str, **variables: Number) -> Number | bool:
    """Parse and evaluate ``source`` with the given variables."""
    return evaluate(parse(source), variables)
