"""Candidate fixes from a listing the agent read, and the bash loop that tries them against real tests."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
import textwrap

from orchard.tasks.swe.bugs import find_mutations
from orchard.tasks.swe.candidates import (
    Candidate,
    candidate_fixes,
    function_lines,
    listing_line,
    numbered_lines,
    search_command,
    sed_replace_line,
)

MODULE = '''"""Helpers."""


def score(xs):
    """Score ``xs``."""
    if not xs:
        return 3
    if len(xs) > 3:
        return xs[1] + 9
    return xs[-1] * 6


def halve(x):
    return x // 2
'''


def _listing(text: str, first: int = 1, last: int | None = None) -> str:
    lines = text.split("\n")
    return "\n".join(listing_line(n, line) for n, line in enumerate(lines, start=1) if first <= n <= (last or len(lines)))


def _changed_spans(old: str, new: str) -> tuple[str, str]:
    """What differs between two strings once their common prefix and suffix are cut."""
    prefix = next((i for i, (a, b) in enumerate(zip(old, new, strict=False)) if a != b), min(len(old), len(new)))
    rest = list(zip(old[prefix:][::-1], new[prefix:][::-1], strict=False))
    suffix = next((i for i, (a, b) in enumerate(rest) if a != b), len(rest))
    return old[prefix:len(old) - suffix], new[prefix:len(new) - suffix]


def test_a_listing_gives_the_function_it_holds():
    lines = numbered_lines("Here's the result of running `cat -n` on x.py:\n" + _listing(MODULE, 3))
    assert lines[4] == "def score(xs):" and 2 not in lines
    body = function_lines(lines, "score")
    assert sorted(body) == list(range(4, 11))  # the def line to the last statement, not the blank lines after
    assert list(function_lines(lines, "halve")) == [13, 14]
    assert function_lines(lines, "missing") == {}
    # a listing that stops inside the function: its lines do not parse, so there is nothing to try
    assert candidate_fixes(numbered_lines(_listing(MODULE, 1, 8)), "score") == []


def test_the_candidates_are_one_token_changes_and_hold_the_inverse_of_a_bug():
    candidates = candidate_fixes(numbered_lines(_listing(MODULE)), "score")
    lines = MODULE.split("\n")
    assert candidates and all(5 <= c.number <= 10 for c in candidates)
    assert [c.number for c in candidates] == sorted(c.number for c in candidates)  # in source order
    assert len(set(candidates)) == len(candidates)
    for candidate in candidates:  # the line as read with one short span changed, its indentation kept
        old, new = _changed_spans(lines[candidate.number - 1], candidate.text)
        assert candidate.text.startswith("    ") and old != new and len(old) <= 4 and len(new) <= 4, candidate
    assert Candidate(9, "        return xs[0] + 9") in candidates  # the inverse of the bug `xs[0]` -> `xs[1]`
    assert Candidate(6, "    if xs:") in candidates
    assert Candidate(13, "def halve(x):") not in candidates
    # each bug the injector makes in the function whose inverse is one token is undone by a candidate
    fixed = {(m.line, m.apply(MODULE).split("\n")[m.line - 1]) for m in find_mutations(MODULE, "m.py")
             if m.function == "score" and m.kind != "remove_statement"}
    assert len(fixed & {(c.number, c.text) for c in candidates}) >= len(candidates) - 2


def test_sed_rewrites_a_line_whatever_it_holds(tmp_path):
    path = tmp_path / "f.py"
    path.write_text("a = 1\nb = 2\n")
    text = r"    return x / 2 & y \ 'z'"
    subprocess.run(["sed", "-i", sed_replace_line(2, text), str(path)], check=True)
    assert path.read_text() == f"a = 1\n{text}\n"


def _repository(tmp_path, body: str):
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text("")
    (tmp_path / "pkg" / "m.py").write_text(body)
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test_m.py").write_text(textwrap.dedent("""\
        from pkg.m import score


        def test_score():
            assert score([-3, -2, 5, -3]) == 6
            assert score([]) == 3
            assert score([4]) == 24
        """))
    for command in (["git", "init", "-q"], ["git", "add", "-A"],
                    ["git", "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "buggy"]):
        subprocess.run(command, cwd=tmp_path, check=True)


def _search(tmp_path, candidates) -> str:
    # this interpreter's pytest, without the suite's plugins (a sandbox's repository has none)
    test_command = f"{shlex.quote(sys.executable)} -m pytest -q -x -p no:cacheprovider"
    done = subprocess.run(["bash", "-c", search_command(candidates, "pkg/m.py", test_command=test_command)],
                          cwd=tmp_path, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"})
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_the_loop_keeps_the_first_candidate_that_passes_and_restores_the_others(tmp_path):
    _repository(tmp_path, MODULE)
    candidates = candidate_fixes(numbered_lines(_listing(MODULE)), "score")
    # each candidate is written as the listing showed its line: the same number, one token changed
    assert listing_line(9, "        return xs[0] + 9") in search_command(candidates, "pkg/m.py")
    output = _search(tmp_path, candidates)
    assert output == "passes with line 9:         return xs[0] + 9\n"
    diff = subprocess.run(["git", "diff", "-U0"], cwd=tmp_path, capture_output=True, text=True, check=True).stdout
    assert "-        return xs[1] + 9\n+        return xs[0] + 9\n" in diff and diff.count("\n+ ") == 1
    subprocess.run(["git", "checkout", "-q", "--", "."], cwd=tmp_path, check=True)
    # none passes: nothing printed, the file as it was
    assert _search(tmp_path, [c for c in candidates if c.number != 9]) == ""
    assert subprocess.run(["git", "status", "--porcelain", "pkg"], cwd=tmp_path, capture_output=True, text=True,
                          check=True).stdout == ""
