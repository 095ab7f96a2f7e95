"""Candidate fixes of a function read in a numbered listing: every one-token change to its lines.

Generate-and-validate repair (GenProg, PraPR): when a failing test has located a function but not its
wrong token, try each small change to the function's lines, rerun the tests after each, and keep the first
that makes them pass. The changes are the mutation operators that :mod:`orchard.tasks.swe.bugs` injects
bugs with (an operator swapped, a comparison negated or moved across its boundary, a constant or an index
one off), applied to the code as the agent read it, never to the repository on disk. They are also what
such a bug's fix is: its inverse is one of them (for 97% of the skills split's bugs; the others' inverse is
no single mutation of the buggy text, such as a ``+ 1`` to delete).

:func:`search_command` writes the whole search as one bash command: the candidates as ``nl -ba`` prints
lines (a policy that imitates it writes each as a copy of a line it read, after the same number, with one
token changed), then a loop over them.
"""

from __future__ import annotations

import re
import shlex
import textwrap
from dataclasses import dataclass

from orchard.tasks.swe.bugs import check_mutation, find_mutations

# The kinds whose inverse is a one-token change (a removed statement cannot be recovered from what is left).
CANDIDATE_KINDS = ("swap_operator", "off_by_one", "invert_condition", "change_constant")
_NUMBERED = re.compile(r"^ *(\d+)\t(.*)$")


@dataclass(frozen=True)
class Candidate:
    """Line ``number`` of the file rewritten as ``text``."""

    number: int
    text: str


def numbered_lines(listing: str) -> dict[int, str]:
    """The lines of ``nl -ba`` or ``cat -n`` output (a number right-aligned, a tab, the text) by number."""
    return {int(match.group(1)): match.group(2) for line in listing.splitlines()
            if (match := _NUMBERED.match(line))}


def function_lines(lines: dict[int, str], function: str) -> dict[int, str]:
    """The numbered lines of ``def function`` (its ``def`` line and its indented body, blank lines inside
    it kept), from the first such definition in ``lines``; empty when there is none."""
    numbers = sorted(lines)
    start = next((n for n in numbers if re.match(rf"\s*(?:async\s+)?def\s+{re.escape(function)}\(", lines[n])), None)
    if start is None:
        return {}
    indent = len(lines[start]) - len(lines[start].lstrip())
    body = {start: lines[start]}
    for number in range(start + 1, numbers[-1] + 1):
        text = lines.get(number)
        if text is None:
            break  # a gap in the listing: the function's end was not read
        if text.strip() and len(text) - len(text.lstrip()) <= indent:
            break
        body[number] = text
    while len(body) > 1 and not body[max(body)].strip():
        del body[max(body)]
    return body


def candidate_fixes(lines: dict[int, str], function: str, path: str = "<read>") -> list[Candidate]:
    """Every one-token change to ``def function``'s lines in ``lines`` (:func:`numbered_lines`), in the
    order of the source, left to right on a line; each a whole line rewritten. Empty when the function's
    lines were not all read (they do not parse)."""
    body = function_lines(lines, function)
    if not body:
        return []
    numbers = sorted(body)
    source = textwrap.dedent("\n".join(body[n] for n in numbers)) + "\n"
    margin = body[numbers[0]][: len(body[numbers[0]]) - len(source.split("\n", 1)[0])]
    try:
        mutations = find_mutations(source, path, CANDIDATE_KINDS)
    except SyntaxError:
        return []
    original = source.split("\n")
    seen: set[Candidate] = set()
    candidates: list[Candidate] = []
    for mutation in sorted(mutations, key=lambda m: (m.start, m.end)):
        reason, changed = check_mutation(source, mutation)
        changed_lines = changed.split("\n")
        if reason is not None or len(changed_lines) != len(original):
            continue
        differ = [i for i, (old, new) in enumerate(zip(original, changed_lines, strict=True)) if old != new]
        if len(differ) != 1:
            continue
        candidate = Candidate(numbers[differ[0]], margin + changed_lines[differ[0]])
        if candidate not in seen:
            seen.add(candidate)
            candidates.append(candidate)
    return candidates


def sed_replace_line(number: int, text: str) -> str:
    """The ``sed`` script that rewrites line ``number`` as ``text``."""
    escaped = re.sub(r"([\\/&])", r"\\\1", text)
    return f"{number}s/.*/{escaped}/"


def listing_line(number: int, text: str) -> str:
    """A line as ``nl -ba`` prints it: the number right-aligned in six places, a tab, the text."""
    return f"{number:>6}\t{text}"


def search_command(candidates: list[Candidate], path: str, test_command: str = "python -m pytest -q -x") -> str:
    """One bash command that writes the candidates to a file, a line each as ``nl -ba`` printed the line it
    changes (so each is the line the agent read with one token changed, after the same number), then
    applies each to ``path`` in turn (``sed``'s ``c`` command), runs ``test_command``, stops at the first
    that passes (printing it) and otherwise restores the file (``git checkout``) for the next.

    Candidates whose text holds a backslash are left out (``sed``'s ``c`` would read it as an escape)."""
    fixes = "\n".join(listing_line(c.number, c.text) for c in candidates if "\\" not in c.text)
    quoted = shlex.quote(path)
    return (f"cat > /tmp/fixes <<'FIXES'\n{fixes}\nFIXES\n"
            f"while IFS=$'\\t' read -r n line; do\n"
            f"  sed -i \"$((n))c\\\\$line\" {quoted}\n"
            f"  {test_command} >/dev/null 2>&1 && {{ echo \"passes with line $((n)): $line\"; break; }}\n"
            f"  git checkout -q -- {quoted}\n"
            f"done < /tmp/fixes")
