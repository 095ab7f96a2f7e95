"""Tokens to a tree, by precedence climbing (a Pratt parser).

Nodes are tuples: ``("num", value)``, ``("var", name)``, ``("neg", operand)``,
``("bin", op, left, right)`` and ``("call", name, args)``.
"""

from __future__ import annotations

from minicalc.errors import CalcError
from minicalc.tokenizer import Token, tokenize

# Binding power of each binary operator; ``**`` is right-associative.
PRECEDENCE = {
    "<": 1, "<=": 1, ">": 1, ">=": 1, "==": 1, "!=": 1,
    "+": 2, "-": 2,
    "*": 3, "/": 3, "//": 3, "%": 3,
    "**": 5,
}
RIGHT_ASSOCIATIVE = {"**"}
UNARY_PRECEDENCE = 4


class Parser:
    def __init__(self, tokens: list[Token]) -> None:
        self.tokens = tokens
        self.index = 0

    @property
    def current(self) -> Token:
        return self.tokens[self.index]

    def advance(self) -> Token:
        token = self.tokens[self.index]
        self.index += 1
        return token

    def expect(self, text: str) -> Token:
        token = self.current
        if token.text != text:
            found = token.text or "end of input"
            raise CalcError(f"expected {text!r}, found {found!r}", token.position)
        return self.advance()

    def expression(self, min_precedence: int = 0) -> tuple:
        left = self.prefix()
        while True:
            token = self.current
            precedence = PRECEDENCE.get(token.text) if token.kind == "op" else None
            if precedence is None or precedence <= min_precedence:
                return left
            self.advance()
            next_min = precedence - 1 if token.text in RIGHT_ASSOCIATIVE else precedence
            right = self.expression(next_min)
            left = ("bin", token.text, left, right)

    def prefix(self) -> tuple:
        token = self.advance()
        if token.kind == "number":
            value = float(token.text) if "." in token.text else int(token.text)
            return ("num", value)
        if token.kind == "name":
            if self.current.text == "(":
                return ("call", token.text, self.arguments())
            return ("var", token.text)
        if token.text == "-":
            return ("neg", self.expression(UNARY_PRECEDENCE))
        if token.text == "+":
            return self.expression(UNARY_PRECEDENCE)
        if token.text == "(":
            inner = self.expression()
            self.expect(")")
            return inner
        found = token.text or "end of input"
        raise CalcError(f"unexpected {found!r}", token.position)

    def arguments(self) -> list[tuple]:
        self.expect("(")
        args: list[tuple] = []
        if self.current.text != ")":
            args.append(self.expression())
            while self.current.text == ",":
                self.advance()
                args.append(self.expression())
        self.expect(")")
        return args


def parse(source: str) -> tuple:
    parser = Parser(tokenize(source))
    tree = parser.expression()
    if parser.current.kind != "end":
        raise CalcError(f"unexpected {parser.current.text!r}", parser.current.position)
    return tree
