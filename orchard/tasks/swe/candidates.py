"""Generate-and-validate repair of one function: a script an agent writes to try every one-token change.

When a failing test has located a function but not its wrong token, an engineer without the arithmetic to
hand can try each small change to the function's lines, rerun the tests after each, and keep the first that
makes them pass (GenProg, PraPR). :func:`repair_command` is that search as one bash command: a Python script
on its standard input, the same text for every task, given the function's definition as ``PATH:LINE``. Its
changes are the inverses of the bug kinds :mod:`orchard.tasks.swe.bugs` injects: an operator swapped, a
comparison moved across its boundary or negated, a condition's ``not`` added or dropped, an integer one off, a
boolean flipped.

The script departs from the paper's teachers, whose fixes come from a model's reading of the code: here the
agent chooses where to search (the function's definition, copied from what its search printed) and the script
chooses the token. A policy that imitates it learns to localise a bug and to run the repair, which carries to
code it never saw; writing the fixed line itself takes arithmetic on the failing assertion that a small policy
trained from scratch did not learn (README, the skills variant).
"""

from __future__ import annotations

import re
import shlex

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
n=next(x for x in ast.walk(ast.parse(s)) if isinstance(x,ast.FunctionDef) and x.lineno==int(f))
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


def numbered_lines(listing: str) -> dict[int, str]:
    """The lines of ``nl -ba`` or ``cat -n`` output (a number right-aligned, a tab, the text) by number."""
    return {int(match.group(1)): match.group(2) for line in listing.splitlines()
            if (match := _NUMBERED.match(line))}


def listing_line(number: int, text: str) -> str:
    """A line as ``nl -ba`` prints it: the number right-aligned in six places, a tab, the text."""
    return f"{number:>6}\t{text}"


def repair_command(path: str, def_line: int, test_command: str = "python -m pytest -q -x") -> str:
    """The bash command that runs :data:`REPAIR_SCRIPT` on the function whose ``def`` is on line ``def_line`` of
    ``path`` (from the repository root; written ``./PATH:LINE``, as ``grep -rn`` prints a hit), checking each
    change with ``test_command``."""
    script = REPAIR_SCRIPT.replace("TESTS", repr(test_command), 1)
    return f"python - {shlex.quote(f'./{path}:{def_line}')} <<'PY'\n{script}PY"
