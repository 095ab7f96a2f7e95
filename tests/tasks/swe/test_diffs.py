"""The one diff parser and writer of the SWE tasks."""

from __future__ import annotations

import subprocess

import pytest

from orchard.tasks.swe.diffs import new_file_diff, parse_diff, parse_patch, patched_files, unified_diff

OLD = "def f():\n    return 1\n\n\n-- a comment line of a data file\ndef g(a, b):\n    return a - b\n"


def test_parse_reads_files_and_hunks_by_their_line_counts():
    new = OLD.replace("-- a comment", "++ a comment").replace("a - b", "a + b")
    diff = unified_diff(OLD, new, "pkg/m.py") + new_file_diff("", "tests/empty.py") + new_file_diff("x\n", "t/n.py")
    files = parse_diff(diff)
    assert [(f.old_path, f.new_path) for f in files] == [("pkg/m.py", "pkg/m.py"), (None, "tests/empty.py"),
                                                         (None, "t/n.py")]
    [hunk] = files[0].hunks
    assert "-- a comment line of a data file" in hunk.old and "++ a comment line of a data file" in hunk.new
    assert patched_files(diff) == ["pkg/m.py", "tests/empty.py", "t/n.py"]  # the empty new file too
    assert patched_files("--- a/gone.py\n+++ /dev/null\n@@ -1 +0,0 @@\n-x\n") == ["gone.py"]
    assert parse_diff("not a diff") == []
    with pytest.raises(ValueError, match="no hunks"):
        parse_patch("not a diff")


def test_one_hunk_alone_applies_with_git(tmp_path):
    new = OLD.replace("return 1", "return 2").replace("a - b", "a + b")
    first, second = parse_patch(unified_diff(OLD, new, "m.py", context=1))
    (tmp_path / "m.py").write_text(OLD)
    subprocess.run(["git", "init", "-q"], cwd=tmp_path, check=True)
    (tmp_path / "fix.patch").write_text(second.patch())
    subprocess.run(["git", "apply", "fix.patch"], cwd=tmp_path, check=True)
    assert (tmp_path / "m.py").read_text() == OLD.replace("a - b", "a + b")  # only the second hunk
    assert first.old_start == 1 and second.section == "" and second.lines[0].startswith(" ")
