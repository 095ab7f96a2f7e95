"""The repair script an agent writes: run against real tests in a real git repository, it undoes each kind of
injected bug, and leaves the file as it was when no one-token change passes."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys

import pytest

from orchard.tasks.swe.bugs import find_mutations
from orchard.tasks.swe.candidates import listing_line, numbered_lines, repair_command

MODULE = '''"""Helpers."""


def score(xs):
    """Score ``xs``."""
    if not xs:
        return 3
    if len(xs) > 3 and xs[0] >= 0:
        return xs[0] + 9
    return xs[-1] * 6


def halve(x):
    return x // 2
'''
TESTS = """\
from pkg.m import halve, score


def test_score():
    assert score([2, -2, 5, -3]) == 11
    assert score([-1, 2, 3, 4]) == 24
    assert score([5, 2, 1, 1]) == 14
    assert score([]) == 3
    assert score([4]) == 24


def test_halve():
    assert halve(9) == 4
"""


def test_a_listing_reads_back_by_line_number():
    listing = "Here's the result of running `cat -n` on x.py:\n" + "\n".join(
        listing_line(n, line) for n, line in enumerate(MODULE.split("\n"), start=1) if n >= 3)
    lines = numbered_lines(listing)
    assert lines[4] == "def score(xs):" and lines[8] == "    if len(xs) > 3 and xs[0] >= 0:" and 2 not in lines
    assert listing_line(12, "x") == "    12\tx"


def _repository(tmp_path, body: str):
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text("")
    (tmp_path / "pkg" / "m.py").write_text(body)
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test_m.py").write_text(TESTS)
    for command in (["git", "init", "-q"], ["git", "add", "-A"],
                    ["git", "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "buggy"]):
        subprocess.run(command, cwd=tmp_path, check=True)


def _repair(tmp_path) -> str:
    # this interpreter's pytest, without the suite's plugins (a sandbox's repository has none)
    command = repair_command("pkg/m.py", 4, f"{shlex.quote(sys.executable)} -m pytest -q -x -p no:cacheprovider")
    done = subprocess.run(["bash", "-c", command.replace("python -", f"{shlex.quote(sys.executable)} -", 1)],
                          cwd=tmp_path, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"})
    assert done.returncode == 0, done.stderr
    return done.stdout


def _bugs() -> list[tuple[str, str]]:
    """One injected bug of each kind the script undoes, in ``score``'s body: (kind, buggy module)."""
    wanted = {("swap_operator", 9, "`+` -> `-`"), ("off_by_one", 9, "`0` -> `1`"),
              ("invert_condition", 8, "`>=` -> `<`"), ("change_constant", 7, "`3` -> `4`")}
    return [(m.kind, m.apply(MODULE)) for m in find_mutations(MODULE, "pkg/m.py")
            if (m.kind, m.line, m.description) in wanted]


@pytest.mark.parametrize("kind,buggy", _bugs(), ids=[kind for kind, _ in _bugs()])
def test_the_script_undoes_an_injected_bug(tmp_path, kind, buggy):
    _repository(tmp_path, buggy)
    output = _repair(tmp_path)
    assert output.startswith("passes with line "), output
    assert (tmp_path / "pkg" / "m.py").read_text() == MODULE  # the one-token change that passes is the bug's inverse


def test_the_script_restores_the_file_when_no_change_passes(tmp_path):
    buggy = MODULE.replace("        return xs[0] + 9", "        return xs[1] + 8")  # two tokens off
    _repository(tmp_path, buggy)
    assert _repair(tmp_path) == "no one-token change to the function at line 4 passes\n"
    status = subprocess.run(["git", "status", "--porcelain"], cwd=tmp_path, capture_output=True, text=True, check=True)
    assert status.stdout == ""
