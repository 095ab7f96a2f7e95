"""Procedural bugs, SWE-smith style: small AST-located rewrites of one spot in a Python file.

:func:`find_mutations` parses a file, walks the bodies of its functions and methods (never
module-level code, decorators, default values, annotations or f-strings) and proposes one
:class:`Mutation` per rewritable spot and variant:

========================  =================================================================
``swap_operator``         ``+``/``-``, ``*``/``/``, ``//``/``/``, ``%``/``//``, ``**``/``*``, ``&``/``|``,
                          ``<<``/``>>``, ``and``/``or``, ``+=``/``-=``, and ``<``/``<=``, ``>``/``>=``
``off_by_one``            an integer ±1, or ``+ 1``/``- 1`` added, in a comparison, slice, index or
                          ``range()`` argument
``invert_condition``      ``not`` added to or removed from an ``if``/``while``/conditional
                          expression/comprehension test; a comparison negated (``<`` → ``>=``,
                          ``==`` → ``!=``, ``in`` → ``not in``, ``is`` → ``is not``)
``remove_statement``      an assignment, call, ``raise``, ``if``, loop, ``break`` or
                          ``continue`` deleted (``pass`` left when it was alone in its block)
``change_constant``       any other number changed by one, ``True``/``False`` flipped
========================  =================================================================

A mutation is a precise text edit: the characters of the operator, constant, condition or
statement are replaced and every other byte of the file stays as it was, so the gold patch is
the smallest possible diff. The AST gives positions; each edit checks that the text it replaces is
what the AST says is there (an operator symbol, a literal equal to the constant), and skips the
spot otherwise (comments or line continuations between operands, odd positions).

:mod:`orchard.tasks.swe.diffs` makes ``git apply``-able patches of them.
"""

from __future__ import annotations

import ast
import hashlib
import re
from dataclasses import dataclass

KINDS = ("swap_operator", "off_by_one", "invert_condition", "remove_statement", "change_constant")

_BINOP_SWAPS: dict[type, tuple[str, str]] = {
    ast.Add: ("+", "-"), ast.Sub: ("-", "+"), ast.Mult: ("*", "/"), ast.Div: ("/", "*"),
    ast.FloorDiv: ("//", "/"), ast.Mod: ("%", "//"), ast.Pow: ("**", "*"), ast.BitAnd: ("&", "|"),
    ast.BitOr: ("|", "&"), ast.LShift: ("<<", ">>"), ast.RShift: (">>", "<<"),
}
_BOUNDARY_SWAPS: dict[type, tuple[str, str]] = {
    ast.Lt: ("<", "<="), ast.LtE: ("<=", "<"), ast.Gt: (">", ">="), ast.GtE: (">=", ">"),
}
_NEGATIONS: dict[type, tuple[str, str]] = {
    ast.Lt: ("<", ">="), ast.LtE: ("<=", ">"), ast.Gt: (">", "<="), ast.GtE: (">=", "<"),
    ast.Eq: ("==", "!="), ast.NotEq: ("!=", "=="), ast.In: ("in", "not in"), ast.NotIn: ("not in", "in"),
    ast.Is: ("is", "is not"), ast.IsNot: ("is not", "is"),
}
# Expressions that stay one operand when `` + 1`` is appended in an argument or slice position.
_ATOMS = (ast.Name, ast.Attribute, ast.Call, ast.Subscript)
_REMOVABLE = (ast.Assign, ast.AugAssign, ast.AnnAssign, ast.Expr, ast.Raise, ast.If, ast.For, ast.While,
              ast.Break, ast.Continue)
_GAP_JUNK = " \t\r\n()"


@dataclass(frozen=True)
class Mutation:
    """One edit of one file: replace ``text[start:end]`` with ``replacement``."""

    kind: str
    path: str  # relative to the repository root
    function: str  # qualified name of the enclosing function, e.g. "Interval.overlaps"
    line: int  # 1-based line of the edit's start in the original file
    start: int  # character offsets in the original text
    end: int
    original: str  # text[start:end]
    replacement: str
    description: str  # what changed, for reports (never shown to an agent)

    @property
    def key(self) -> str:
        """A short stable id of the edit."""
        return hashlib.sha1(f"{self.path}:{self.start}:{self.end}:{self.replacement}".encode()).hexdigest()[:8]

    def apply(self, text: str) -> str:
        if text[self.start:self.end] != self.original:
            raise ValueError(f"{self.path}: the text at {self.start}:{self.end} is not {self.original!r}")
        return text[:self.start] + self.replacement + text[self.end:]


class _Positions:
    """AST (line, UTF-8 byte column) pairs to character offsets in the text."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.lines = re.findall(r"[^\n]*\n|[^\n]+$", text)
        self.starts = [0]
        for line in self.lines:
            self.starts.append(self.starts[-1] + len(line))

    def offset(self, line: int, col: int) -> int:
        prefix = self.lines[line - 1].encode("utf-8")[:col].decode("utf-8", errors="replace")
        return self.starts[line - 1] + len(prefix)

    def span(self, node: ast.AST) -> tuple[int, int]:
        return self.offset(node.lineno, node.col_offset), self.offset(node.end_lineno, node.end_col_offset)

    def segment(self, node: ast.AST) -> str:
        start, end = self.span(node)
        return self.text[start:end]


class _Finder(ast.NodeVisitor):
    def __init__(self, text: str, path: str) -> None:
        self.pos = _Positions(text)
        self.text = text
        self.path = path
        self.scope: list[str] = []
        self.functions = 0  # how many function bodies enclose the current node
        self.found: list[Mutation] = []
        self.numeric_context: set[int] = set()  # ids of constants that off_by_one already covers

    # -- recording
    def add(self, kind: str, start: int, end: int, replacement: str, description: str) -> None:
        original = self.text[start:end]
        if original == replacement:
            return
        line = self.text.count("\n", 0, start) + 1
        self.found.append(Mutation(kind, self.path, ".".join(self.scope), line, start, end, original,
                                   replacement, description))

    def operator_span(self, left: ast.AST, right: ast.AST, symbol: str) -> tuple[int, int] | None:
        """The span of ``symbol`` between two operands; None when the gap holds anything else."""
        start, stop = self.pos.span(left)[1], self.pos.span(right)[0]
        gap = self.text[start:stop]
        if "#" in gap or "\\" in gap:
            return None
        lead = len(gap) - len(gap.lstrip(_GAP_JUNK))
        trail = len(gap) - len(gap.rstrip(_GAP_JUNK))
        token = gap[lead:len(gap) - trail]
        if " ".join(token.split()) != symbol:
            return None
        return start + lead, stop - trail

    # -- scopes
    def visit_FunctionDef(self, node: ast.FunctionDef | ast.AsyncFunctionDef) -> None:
        self.scope.append(node.name)
        self.functions += 1
        self.block(node.body)
        self.functions -= 1
        self.scope.pop()

    visit_AsyncFunctionDef = visit_FunctionDef

    def visit_ClassDef(self, node: ast.ClassDef) -> None:
        self.scope.append(node.name)
        for statement in node.body:
            self.visit(statement)
        self.scope.pop()

    def visit_Lambda(self, node: ast.Lambda) -> None:
        self.visit(node.body)

    def visit_JoinedStr(self, node: ast.JoinedStr) -> None:
        return  # f-string internals: positions are unreliable before Python 3.12

    def visit_AnnAssign(self, node: ast.AnnAssign) -> None:
        if node.value is not None:
            self.visit(node.value)

    def generic_visit(self, node: ast.AST) -> None:
        for _, value in ast.iter_fields(node):
            if isinstance(value, list) and value and all(isinstance(v, ast.stmt) for v in value):
                self.block(value)
            elif isinstance(value, list):
                for item in value:
                    if isinstance(item, ast.AST):
                        self.visit(item)
            elif isinstance(value, ast.AST):
                self.visit(value)

    def block(self, statements: list[ast.stmt]) -> None:
        code = [s for i, s in enumerate(statements) if not (i == 0 and _is_docstring(s))]
        for statement in statements:
            if self.functions and statement in code:
                self.removal(statement, alone=len(code) == 1)
            self.visit(statement)

    # -- remove_statement
    def removal(self, node: ast.stmt, alone: bool) -> None:
        if not isinstance(node, _REMOVABLE) or (isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)):
            return
        start, end = self.pos.span(node)
        line_start = self.text.rfind("\n", 0, start) + 1
        line_end = self.text.find("\n", end)
        line_end = len(self.text) if line_end < 0 else line_end + 1
        before, after = self.text[line_start:start], self.text[end:line_end]
        if before.strip() or after.strip().split("#", 1)[0].strip():  # shares a line with other code
            return
        if self.text.startswith("elif", start):  # an elif branch, not a statement of its own
            return
        summary = " ".join(self.text[start:end].split("\n", 1)[0].split())[:60]
        if alone:
            self.add("remove_statement", start, end, "pass", f"removed `{summary}` (left `pass`)")
        else:
            self.add("remove_statement", line_start, line_end, "", f"removed `{summary}`")

    # -- operators
    def visit_BinOp(self, node: ast.BinOp) -> None:
        formatting = isinstance(node.op, ast.Mod) and isinstance(node.left, ast.Constant | ast.JoinedStr)
        if self.functions and type(node.op) in _BINOP_SWAPS and not formatting:  # not "%s" % x
            symbol, other = _BINOP_SWAPS[type(node.op)]
            if (span := self.operator_span(node.left, node.right, symbol)) is not None:
                self.add("swap_operator", *span, other, f"`{symbol}` -> `{other}`")
        self.generic_visit(node)

    def visit_AugAssign(self, node: ast.AugAssign) -> None:
        if self.functions and type(node.op) in _BINOP_SWAPS:
            symbol, other = _BINOP_SWAPS[type(node.op)]
            if (span := self.operator_span(node.target, node.value, symbol + "=")) is not None:
                self.add("swap_operator", *span, other + "=", f"`{symbol}=` -> `{other}=`")
        self.generic_visit(node)

    def visit_BoolOp(self, node: ast.BoolOp) -> None:
        if self.functions and len(node.values) == 2:
            symbol, other = ("and", "or") if isinstance(node.op, ast.And) else ("or", "and")
            if (span := self.operator_span(node.values[0], node.values[1], symbol)) is not None:
                self.add("swap_operator", *span, other, f"`{symbol}` -> `{other}`")
        self.generic_visit(node)

    def visit_Compare(self, node: ast.Compare) -> None:
        if self.functions:
            operands = [node.left, *node.comparators]
            for index, op in enumerate(node.ops):
                for kind, table in (("swap_operator", _BOUNDARY_SWAPS), ("invert_condition", _NEGATIONS)):
                    if type(op) in table:
                        symbol, other = table[type(op)]
                        span = self.operator_span(operands[index], operands[index + 1], symbol)
                        if span is not None:
                            self.add(kind, *span, other, f"`{symbol}` -> `{other}`")
            for operand in operands:
                self.off_by_one(operand, atoms=False)
        self.generic_visit(node)

    # -- off_by_one
    def off_by_one(self, node: ast.AST | None, atoms: bool = True) -> None:
        """±1 on an integer literal (``-1`` included), or ``+ 1``/``- 1`` after a simple operand."""
        if node is None:
            return
        literal = node.operand if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub) else node
        if isinstance(literal, ast.Constant) and type(literal.value) is int:
            self.numeric_context.add(id(literal))
            start, end = self.pos.span(literal)
            if _literal_is(self.text[start:end], literal.value):
                for delta in (1, -1):
                    value = literal.value + delta
                    if value >= 0:
                        self.add("off_by_one", start, end, str(value), f"`{literal.value}` -> `{value}`")
        elif atoms and isinstance(node, _ATOMS):
            start, end = self.pos.span(node)
            for sign in ("+", "-"):
                self.add("off_by_one", end, end, f" {sign} 1", f"`{self.pos.segment(node)[:40]}` -> `... {sign} 1`")

    def visit_Slice(self, node: ast.Slice) -> None:
        if self.functions:
            self.off_by_one(node.lower)
            self.off_by_one(node.upper)
        self.generic_visit(node)

    def visit_Subscript(self, node: ast.Subscript) -> None:
        if self.functions and not isinstance(node.slice, ast.Slice | ast.Tuple):
            self.off_by_one(node.slice, atoms=False)
        self.generic_visit(node)

    def visit_Call(self, node: ast.Call) -> None:
        if self.functions and isinstance(node.func, ast.Name) and node.func.id == "range":
            for arg in node.args:
                self.off_by_one(arg)
        self.generic_visit(node)

    # -- change_constant
    def visit_Constant(self, node: ast.Constant) -> None:
        if not self.functions or id(node) in self.numeric_context:
            return
        start, end = self.pos.span(node)
        if isinstance(node.value, bool):
            other = "False" if node.value else "True"
            if self.text[start:end] == str(node.value):
                self.add("change_constant", start, end, other, f"`{node.value}` -> `{other}`")
        elif isinstance(node.value, int | float) and _literal_is(self.text[start:end], node.value):
            for delta in (1, -1):
                value = node.value + delta
                if value >= 0:
                    self.add("change_constant", start, end, repr(value), f"`{node.value!r}` -> `{value!r}`")

    # -- invert_condition
    def condition(self, test: ast.expr) -> None:
        if not self.functions:
            return
        start, end = self.pos.span(test)
        if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
            operand = self.pos.segment(test.operand)
            if isinstance(test.operand, ast.NamedExpr):
                operand = f"({operand})"
            self.add("invert_condition", start, end, operand, "removed `not`")
        elif not isinstance(test, ast.Compare):  # a comparison is negated by its operator instead (visit_Compare)
            text = self.text[start:end]
            simple = isinstance(test, ast.Name | ast.Attribute | ast.Call | ast.Subscript | ast.Constant)
            self.add("invert_condition", start, end, f"not {text}" if simple else f"not ({text})", "added `not`")

    def visit_If(self, node: ast.If) -> None:
        self.condition(node.test)
        self.generic_visit(node)

    def visit_While(self, node: ast.While) -> None:
        self.condition(node.test)
        self.generic_visit(node)

    def visit_IfExp(self, node: ast.IfExp) -> None:
        self.condition(node.test)
        self.generic_visit(node)

    def visit_comprehension(self, node: ast.comprehension) -> None:
        for test in node.ifs:
            self.condition(test)
        self.generic_visit(node)


def _is_docstring(node: ast.stmt) -> bool:
    return isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str)


def _literal_is(text: str, value: object) -> bool:
    try:
        return ast.literal_eval(text) == value and type(ast.literal_eval(text)) is type(value)
    except (ValueError, SyntaxError):
        return False


def find_mutations(text: str, path: str, kinds: tuple[str, ...] = KINDS) -> list[Mutation]:
    """Every mutation of ``kinds`` in the functions of ``text`` (the file at repository path ``path``).

    Raises ``SyntaxError`` when ``text`` does not parse; unknown kinds are a ``ValueError``.
    """
    unknown = set(kinds) - set(KINDS)
    if unknown:
        raise ValueError(f"unknown mutation kinds {sorted(unknown)}; known: {', '.join(KINDS)}")
    finder = _Finder(text, path)
    finder.visit(ast.parse(text, filename=path))
    return [m for m in finder.found if m.kind in kinds]


def check_mutation(text: str, mutation: Mutation) -> tuple[str | None, str]:
    """``(reason, buggy_text)``: the reason is ``"syntax_error"`` or ``"unchanged"`` when the
    mutated file does not parse or has the same AST as the original, else None."""
    buggy = mutation.apply(text)
    try:
        new_tree = ast.parse(buggy)
    except SyntaxError:
        return "syntax_error", buggy
    if ast.dump(new_tree) == ast.dump(ast.parse(text)):
        return "unchanged", buggy
    return None, buggy
