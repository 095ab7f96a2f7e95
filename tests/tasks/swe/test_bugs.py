"""Synthetic bugs: precise rewrites, patches that apply, and generated tasks whose tests really fail and get fixed."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from orchard.tasks.swe.bugs import Mutation, check_mutation, find_mutations
from orchard.tasks.swe.diffs import new_file_diff, unified_diff
from orchard.tasks.swe.generate import GenerationReport, generate
from orchard.tasks.swe.localtests import run_tests
from orchard.tasks.swe.sources import SHIPPED, RepoSource, package_source, shipped_source
from orchard.tasks.swe.testlog import passing

SOURCE = '''"""Module docstring."""
LIMIT = 10 + 1  # module level: never mutated


def clamp(values, low, high):
    """Docstring stays."""
    out = []
    for value in values[1:]:
        if value < low or value > high:
            continue
        out.append(value * 2)
    total = sum(out) + 3
    flag = True
    label = f"{total + 1}"
    noted = (total +  # a comment between the operands
             1)
    return out if not flag else out[:total]
'''


def mutations_by_description() -> dict[tuple[str, str, int], Mutation]:
    return {(m.kind, m.description, m.line): m for m in find_mutations(SOURCE, "pkg/clamp.py")}


def test_every_mutation_is_a_precise_edit_that_parses():
    found = find_mutations(SOURCE, "pkg/clamp.py")
    assert len(found) > 20
    for mutation in found:
        reason, buggy = check_mutation(SOURCE, mutation)
        assert reason is None, mutation
        assert buggy[:mutation.start] == SOURCE[:mutation.start]  # every other byte is unchanged
        assert buggy[mutation.start + len(mutation.replacement):] == SOURCE[mutation.end:]
        assert mutation.function == "clamp" and mutation.line >= 5  # never the module-level line


def test_each_kind_finds_its_spots():
    found = mutations_by_description()
    expected = [
        ("swap_operator", "`*` -> `/`", 11), ("swap_operator", "`<` -> `<=`", 9), ("swap_operator", "`or` -> `and`", 9),
        ("swap_operator", "`+` -> `-`", 12),
        ("invert_condition", "`<` -> `>=`", 9), ("invert_condition", "`>` -> `<=`", 9),
        ("invert_condition", "added `not`", 9), ("invert_condition", "removed `not`", 17),
        ("off_by_one", "`1` -> `2`", 8), ("off_by_one", "`1` -> `0`", 8), ("off_by_one", "`total` -> `... + 1`", 17),
        ("remove_statement", "removed `continue` (left `pass`)", 10), ("remove_statement", "removed `out = []`", 7),
        ("change_constant", "`3` -> `4`", 12), ("change_constant", "`True` -> `False`", 13),
    ]
    for key in expected:
        assert key in found, key
    assert found[("invert_condition", "added `not`", 9)].replacement == "not (value < low or value > high)"
    assert found[("invert_condition", "removed `not`", 17)].replacement == "flag"
    assert found[("off_by_one", "`total` -> `... + 1`", 17)].apply(SOURCE).endswith("out[:total + 1]\n")
    removed = found[("remove_statement", "removed `out = []`", 7)].apply(SOURCE)
    assert "out = []" not in removed and removed.count("\n") == SOURCE.count("\n") - 1


def test_f_strings_docstrings_and_commented_gaps_are_left_alone():
    found = find_mutations(SOURCE, "pkg/clamp.py")
    assert not {m.line for m in found} & {1, 2, 6}  # module docstring, module level, function docstring
    assert [m.description for m in found if m.line == 14] == ['removed `label = f"{total + 1}"`']  # not inside
    assert [m.kind for m in found if m.line == 15] == ["remove_statement"]  # no `+` swap across the comment


def test_checks_and_bad_input():
    spot = SOURCE.index("sum(out) + 3")
    same = Mutation("swap_operator", "p.py", "clamp", 12, spot, spot + 12, "sum(out) + 3", "sum(out)+3", "spacing")
    broken = Mutation("swap_operator", "p.py", "clamp", 12, spot, spot + 12, "sum(out) + 3", "sum(out) +* 3", "bad")
    assert check_mutation(SOURCE, same)[0] == "unchanged"
    assert check_mutation(SOURCE, broken)[0] == "syntax_error"
    with pytest.raises(ValueError, match="is not 'sum"):
        same.apply(SOURCE.replace("sum(out) + 3", "sum(out) - 3"))
    with pytest.raises(ValueError, match="unknown mutation kinds"):
        find_mutations(SOURCE, "p.py", kinds=("typo",))
    with pytest.raises(SyntaxError):
        find_mutations("def broken(:\n", "p.py")


def git_apply(repo: Path, diff: str) -> None:
    (repo / "change.diff").write_text(diff)
    subprocess.run(["git", "apply", "change.diff"], cwd=repo, check=True, capture_output=True)
    (repo / "change.diff").unlink()


def test_diffs_apply_with_git(tmp_path):
    old, new = "a = 1\nb = 2\nc = 3", "a = 1\nb = 20\nc = 3"  # no newline at the end of the file
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "m.py").write_text(old)
    git_apply(tmp_path, unified_diff(old, new, "pkg/m.py"))
    git_apply(tmp_path, new_file_diff("def test_x():\n    pass\n", "tests/test_new.py"))
    assert (tmp_path / "pkg" / "m.py").read_text() == new
    assert (tmp_path / "tests" / "test_new.py").read_text() == "def test_x():\n    pass\n"
    assert unified_diff(old, old, "pkg/m.py") == ""


@pytest.mark.parametrize("name", SHIPPED)
def test_shipped_repositories_pass_their_own_tests(name, tmp_path):
    source = shipped_source(name)
    source.materialize(str(tmp_path))
    run = run_tests(str(tmp_path), source.test_dirs)
    assert 15 <= len(run.results) <= 60 and passing(run.results) == set(run.results), run.log[-2000:]
    code = source.code_files(str(tmp_path))
    assert code and not any(path.startswith("tests/") for path in code)


def test_generated_bugs_fail_their_tests_and_gold_patches_fix_them(tmp_path):
    report = GenerationReport()
    instances = generate(shipped_source("textkit"), 3, str(tmp_path / "out"), seed=1, report=report)
    assert len(instances) == 3 and report.kept == 3
    assert report.tried == 3 + sum(report.rejected.values())
    for instance in instances:
        snapshot = Path(instance.repo_path)
        meta = instance.metadata
        withheld = meta["withheld_tests"]
        assert withheld == sorted({t.split("::")[0] for t in instance.FAIL_TO_PASS})
        assert not any((snapshot / path).exists() for path in withheld)  # SWE-bench: the tests come with test_patch
        assert (snapshot / meta["path"]).read_text().splitlines()[meta["line"] - 1] == meta["buggy_line"]
        for line in (meta["buggy_line"].strip(), meta["original_line"].strip()):
            assert line not in instance.problem_statement
        repo = tmp_path / "check" / instance.instance_id
        shutil.copytree(snapshot, repo)
        git_apply(repo, instance.test_patch)
        buggy = run_tests(str(repo), ["tests"])
        assert not passing(buggy.results) & set(instance.FAIL_TO_PASS)
        assert set(instance.PASS_TO_PASS) <= passing(buggy.results)
        git_apply(repo, instance.patch)
        fixed = run_tests(str(repo), ["tests"])
        assert set(instance.FAIL_TO_PASS) | set(instance.PASS_TO_PASS) <= passing(fixed.results)
        assert (repo / meta["path"]).read_text() == (Path(shipped_source("textkit").entries["textkit"]) /
                                                     meta["path"].split("/", 1)[1]).read_text()


def test_generation_is_seeded_and_can_keep_the_tests_visible(tmp_path):
    first = generate(shipped_source("intervals"), 3, str(tmp_path / "a"), seed=7, tests_visible=True, jobs=1)
    again = generate(shipped_source("intervals"), 3, str(tmp_path / "b"), seed=7, tests_visible=True, jobs=3)
    assert [i.instance_id for i in first] == [i.instance_id for i in again]  # parallel test runs change nothing
    assert [i.problem_statement for i in first] == [i.problem_statement for i in again]
    first = first[:1]
    [instance] = first
    assert instance.test_patch == "" and not instance.metadata["withheld_tests"]
    assert all((Path(instance.repo_path) / t.split("::")[0]).exists() for t in instance.FAIL_TO_PASS)


MODULE = '''import time


def used(x):
    return x + 1


def untested(x):
    return x * 2


def countdown(n):
    while n > 0:
        time.sleep(0.05)
        n -= 1
    return n


def _check(limit):
    if limit < 0:
        raise ValueError("negative")
    return limit


LIMIT = _check(0)
'''
TESTS = '''from pkg.mod import countdown, used


def test_used():
    assert used(1) == 2


def test_countdown():
    assert countdown(2) == 0


def test_import():
    import pkg.mod  # noqa: F401
'''


def test_rejections_are_counted_by_reason(tmp_path):
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text("")
    (tmp_path / "pkg" / "mod.py").write_text(MODULE)
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test_mod.py").write_text(TESTS)
    source = RepoSource(name="tiny", repo="orchard/tiny", version="1",
                        entries={"pkg": str(tmp_path / "pkg"), "tests": str(tmp_path / "tests")}, test_dirs=("tests",))
    report = GenerationReport()
    kept = generate(source, 10, str(tmp_path / "out"), kinds=("swap_operator",), timeout=6, report=report, jobs=3)
    assert report.tried == 5  # the counts a serial run gives (candidates are judged in order at any jobs)  # + - in used, * / in untested, > >= and -= += in countdown, < <= in _check
    assert dict(report.rejected) == {"no_failing_test": 1, "timeout": 1, "no_passing_test": 1}
    assert sorted(i.metadata["description"] for i in kept) == ["`+` -> `-`", "`>` -> `>=`"]
    assert {i.FAIL_TO_PASS for i in kept} == {("tests/test_mod.py::test_used",), ("tests/test_mod.py::test_countdown",)}


def test_package_sources_find_their_tests(tmp_path):
    toolz = package_source("toolz")
    assert toolz.repo == "pypi/toolz" and "toolz/tests" in toolz.test_dirs
    toolz.materialize(str(tmp_path))
    files = toolz.code_files(str(tmp_path))
    assert "toolz/itertoolz.py" in files and not any("/tests/" in f for f in files)
    assert not list(tmp_path.rglob("__pycache__"))
    with pytest.raises(ValueError, match="not an installed package"):
        package_source("no_such_package_here")
    with pytest.raises(ValueError, match="unknown shipped repository"):
        shipped_source("nope")
