"""Source text to tokens."""

from __future__ import annotations

from dataclasses import dataclass

from minicalc.errors import CalcError

OPERATORS = ("**", "//", "<=", ">=", "==", "!=", "+", "-", "*", "/", "%", "<", ">", "(", ")", ",")


@dataclass(frozen=True)
class Token:
    kind: str  # "number", "name", "op" or "end"
    text: str
    position: int


def _number(source: str, start: int) -> int:
    """The index just past the number that starts at ``start`` (digits, one optional dot)."""
    index = start
    seen_dot = False
    while index < len(source) and (source[index].isdigit() or source[index] == "."):
        if source[index] == ".":
            if seen_dot:
                raise CalcError("a number has two decimal points", index)
            seen_dot = True
        index += 1
    return index


def tokenize(source: str) -> list[Token]:
    tokens: list[Token] = []
    index = 0
    while index < len(source):
        char = source[index]
        if char.isspace():
            index += 1
            continue
        if char.isdigit() or (char == "." and source[index + 1 : index + 2].isdigit()):
            end = _number(source, index)
            tokens.append(Token("number", source[index:end], index))
            index = end
            continue
        if char.isalpha() or char == "_":
            end = index + 1
            while end < len(source) and (source[end].isalnum() or source[end] == "_"):
                end += 1
            tokens.append(Token("name", source[index:end], index))
            index = end
            continue
        for op in OPERATORS:
            if source.startswith(op, index):
                tokens.append(Token("op", op, index))
                index += len(op)
                break
        else:
            raise CalcError(f"unexpected character {char!r}", index)
    tokens.append(Token("end", "", len(source)))
    return tokens
