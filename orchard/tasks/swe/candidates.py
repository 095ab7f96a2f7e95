"""Generate-and-validate repair of one function: a script an agent writes to try every one-token change.

When a failing test has located a function but not its wrong token, an engineer without the arithmetic to
hand can try each small change to the function's lines, rerun the tests after each, and keep the first that
makes them pass (GenProg, PraPR). :func:`repair_command` is that search as one bash command: a Python script
on its standard input, the same text for every task, given the function's definition as ``PATH:LINE``. Its
changes are the inverses of the bug kinds :mod:`orchard.tasks.swe.bugs` injects: an operator swapped, a
comparison moved across its boundary or negated, a condition's ``not`` added or dropped, an integer one off, a
boolean flipped.

The same script can be a tool of the task's sandbox instead (``tasks.repair_tool``): :func:`install_repair_tool`
writes it into the sandbox's tools directory as the command ``repair PATH:LINE``, and the task's prompt says so
(:data:`REPAIR_TOOL_HELP`). The agent's action is then that one line, not the script's ~500 tokens: the same
search, without the decoding and the context spent writing out the same text in every episode.

The script departs from the paper's teachers, whose fixes come from a model's reading of the code: here the
agent chooses where to search (the function's definition, copied from what its search printed) and the script
chooses the token. A policy that imitates it learns to localise a bug and to run the repair, which carries to
code it never saw; writing the fixed line itself takes arithmetic on the failing assertion that a small policy
trained from scratch did not learn (README, the skills variant).
"""

from __future__ import annotations

import re
import shlex
from typing import Any

from orchard.env.api import TOOLS_BIN, TOOLS_DIR

_NUMBERED = re.compile(r"^ *(\d+)\t(.*)$")

# The script, terse as a one-off script typed at a prompt (the policy writes all of it: every token costs a
# decoding step and a place in the context). It reads the file and its function's `def` line from its argument
# (`PATH:LINE`, as `grep -n` printed the definition, so the agent copies it whole from the search's output); W
# maps a token to its replacements; C yields a line's one-token changes (each integer one up and one down, not
# below 0; each token of W replaced; an `if`/`elif`/`while` condition's `not` added or dropped); the loop tries
# each change to each line of the function's body in order, and stops at the first that passes the test suite
# (the file left changed), else restores the file.
REPAIR_SCRIPT = '''\
import ast,io,subprocess,sys,tokenize as T
p,f=sys.argv[1].rsplit(":",1);s=open(p).read();L=s.split("\\n")
n=next((x for x in ast.walk(ast.parse(s)) if isinstance(x,ast.FunctionDef) and x.lineno==int(f)),0)
if not n:sys.exit(f"no def on line {f} of {p}")
W=dict(zip("+ - * / // % < <= > >= == != and or True False".split(),"- + / * / // <=,>= <,> >=,<= >,< != == or and False True".split()))
def C(l):
 i=l[:len(l)-len(l.lstrip())];c=l.strip()
 try:t=list(T.generate_tokens(io.StringIO(c).readline))
 except Exception:return
 for k in t:
  a,b=k.start[1],k.end[1];v=[str(int(k.string)+d) for d in(1,-1)] if k.string.isdigit() else W.get(k.string,"").split(",")
  for w in v:
   if w and w!="-1":yield i+c[:a]+w+c[b:]
 if c.split(" ")[0] in("if","elif","while"):q,r=c.split(" ",1);yield i+q+" "+(r[4:] if r[:4]=="not " else "not "+r)
for j in range(n.lineno,n.end_lineno):
 o=L[j]
 for w in C(o):
  L[j]=w;open(p,"w").write("\\n".join(L))
  if subprocess.run(TESTS,shell=True,capture_output=True).returncode==0:print(f"passes with line {j+1}: {w}");sys.exit()
 L[j]=o
open(p,"w").write(s);print(f"no one-token change to the function at line {f} passes")
'''


REPAIR_TOOL = f"{TOOLS_BIN}/repair"
REPAIR_TOOL_SCRIPT = f"{TOOLS_DIR}/repair.py"
REPAIR_TOOL_HELP = ("The command `repair PATH:LINE` tries every one-token change to the function whose `def` is on "
                    "line LINE of PATH (as `grep -n` prints it), runs the tests after each, and keeps the first "
                    "change that passes them.")
# The tool checks its argument before the script runs: a usage line rather than a traceback.
_TOOL_USAGE = """\
import os,re,sys
if len(sys.argv)!=2 or not re.fullmatch(r"[^:]+:[0-9]+",sys.argv[1]) or not os.path.isfile(sys.argv[1].rsplit(":",1)[0]):
 sys.exit("usage: repair PATH:LINE, the file and line of a function's def (as grep -n prints them)")
"""


def numbered_lines(listing: str) -> dict[int, str]:
    """The lines of ``nl -ba`` or ``cat -n`` output (a number right-aligned, a tab, the text) by number."""
    return {int(match.group(1)): match.group(2) for line in listing.splitlines()
            if (match := _NUMBERED.match(line))}


def listing_line(number: int, text: str) -> str:
    """A line as ``nl -ba`` prints it: the number right-aligned in six places, a tab, the text."""
    return f"{number:>6}\t{text}"


def repair_script(test_command: str = "python -m pytest -q -x") -> str:
    """:data:`REPAIR_SCRIPT` checking each change with ``test_command``."""
    return REPAIR_SCRIPT.replace("TESTS", repr(test_command), 1)


def repair_command(path: str, def_line: int, test_command: str = "python -m pytest -q -x", tool: bool = False) -> str:
    """The bash command that runs :data:`REPAIR_SCRIPT` on the function whose ``def`` is on line ``def_line`` of
    ``path`` (from the repository root; written ``./PATH:LINE``, as ``grep -rn`` prints a hit), checking each
    change with ``test_command``: the script written out on standard input, or with ``tool`` the sandbox's
    ``repair`` command (:func:`install_repair_tool`, whose test command is fixed when it is installed)."""
    target = shlex.quote(f"./{path}:{def_line}")
    if tool:
        return f"repair {target}"
    return f"python - {target} <<'PY'\n{repair_script(test_command)}PY"


async def install_repair_tool(sandbox: Any, test_command: str = "python -m pytest -q -x") -> None:
    """Make ``repair PATH:LINE`` a command of ``sandbox`` (an ``AsyncSandbox`` whose tools directory is first on
    the agent's ``PATH``, with the task's ``python`` shim there): the script at :data:`REPAIR_TOOL_SCRIPT`, after
    a check of its argument, and a shell wrapper at :data:`REPAIR_TOOL`."""
    await sandbox.write_file(REPAIR_TOOL_SCRIPT, _TOOL_USAGE + repair_script(test_command))
    await sandbox.write_file(REPAIR_TOOL, f'#!/bin/sh\nexec python {REPAIR_TOOL_SCRIPT} "$@"\n', mode=0o755)
