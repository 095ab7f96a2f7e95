"""Generate-and-validate repair of one function: a script an agent writes to try every one-token change.

When a failing test has located a function but not its wrong token, an engineer without the arithmetic to
hand can try each small change to the function's lines, rerun the tests after each, and keep the first that
makes them pass (GenProg, PraPR). :func:`repair_command` is that search as one bash command: a Python script
on its standard input, the same text for every task, given the file and the function's name. Its changes are
the inverses of the bug kinds :mod:`orchard.tasks.swe.bugs` injects: an operator swapped, a comparison moved
across its boundary or negated, a condition's ``not`` added or dropped, an integer one off, a boolean flipped.

The script departs from the paper's teachers, whose fixes come from a model's reading of the code: here the
agent chooses where to search (the file and the function, copied from what the traceback and the search
showed it) and the script chooses the token. A policy that imitates it learns to localise a bug and to run the
repair, which carries to code it never saw; writing the fixed line itself would take arithmetic on the failing
assertion that a small policy trained from scratch does not learn (``docs/benchmarks.md``).
"""

from __future__ import annotations

import re
import shlex

_NUMBERED = re.compile(r"^ *(\d+)\t(.*)$")

# Reads the file and the function's name from its arguments, tries each change to each line of the function's
# body in order, and stops at the first that passes the test suite (the file left changed), else restores it.
REPAIR_SCRIPT = '''\
import ast, io, subprocess, sys, tokenize
path, name = sys.argv[1], sys.argv[2]
text = open(path).read()
lines = text.split("\\n")
node = next(n for n in ast.walk(ast.parse(text)) if isinstance(n, ast.FunctionDef) and n.name == name)
swaps = {"+": "-", "-": "+", "*": "/", "/": "*", "//": "/", "%": "//", "<": "<= >=", "<=": "< >",
         ">": ">= <=", ">=": "> <", "==": "!=", "!=": "==", "and": "or", "or": "and", "True": "False",
         "False": "True"}


def changes(line):
    indent, code = line[:len(line) - len(line.lstrip())], line.strip()
    try:
        tokens = list(tokenize.generate_tokens(io.StringIO(code + "\\n").readline))
    except (tokenize.TokenError, SyntaxError):
        return
    for token in tokens:
        start, end = token.start[1], token.end[1]
        if token.type == tokenize.NUMBER and token.string.isdigit():
            news = [str(int(token.string) + 1), str(int(token.string) - 1)]
        else:
            news = swaps.get(token.string, "").split() if token.type in (tokenize.OP, tokenize.NAME) else []
        for new in news:
            if not new.startswith("-"):
                yield indent + code[:start] + new + code[end:]
    if code.startswith(("if ", "elif ", "while ")):
        keyword, condition = code.split(" ", 1)
        yield indent + keyword + " " + (condition[4:] if condition.startswith("not ") else "not " + condition)


for number in range(node.lineno + 1, node.end_lineno + 1):
    old = lines[number - 1]
    for new in changes(old):
        lines[number - 1] = new
        open(path, "w").write("\\n".join(lines))
        if subprocess.run(TESTS, shell=True, capture_output=True).returncode == 0:
            print(f"passes with line {number}: {new}")
            sys.exit(0)
    lines[number - 1] = old
open(path, "w").write(text)
print(f"no one-token change to {name} passes")
'''


def numbered_lines(listing: str) -> dict[int, str]:
    """The lines of ``nl -ba`` or ``cat -n`` output (a number right-aligned, a tab, the text) by number."""
    return {int(match.group(1)): match.group(2) for line in listing.splitlines()
            if (match := _NUMBERED.match(line))}


def listing_line(number: int, text: str) -> str:
    """A line as ``nl -ba`` prints it: the number right-aligned in six places, a tab, the text."""
    return f"{number:>6}\t{text}"


def repair_command(path: str, function: str, test_command: str = "python -m pytest -q -x") -> str:
    """The bash command that runs :data:`REPAIR_SCRIPT` on ``def function`` in ``path`` (from the repository
    root), checking each change with ``test_command``."""
    script = REPAIR_SCRIPT.replace("TESTS", repr(test_command), 1)
    return f"python - {shlex.quote(path)} {shlex.quote(function)} <<'PY'\n{script}PY"
