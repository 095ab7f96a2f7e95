"""Setup and SWE-bench grading in real sandboxes of a real local orchestrator (needs root)."""

from __future__ import annotations

import tarfile
from dataclasses import replace

import pytest

from orchard.tasks.swe.diffs import new_file_diff, unified_diff
from orchard.tasks.swe.generate import generate
from orchard.tasks.swe.grading import grade_in_fresh_sandbox, grade_submission
from orchard.tasks.swe.instance import SWEInstance
from orchard.tasks.swe.sources import shipped_source
from orchard.tasks.swe.workspace import SetupError, reset_workspace, setup_workspace, submission_patch
from tests.tasks.swe.calc import write_calc_repo

OPS = "def add(a, b):\n    return a + b\n\n\ndef sub(a, b):\n    return a - b\n\n\ndef mul(a, b):\n    return a + b\n"
VISIBLE_TESTS = ("from calc.ops import add, sub\n\n\ndef test_add():\n    assert add(2, 3) == 5\n\n\n"
                 "def test_sub():\n    assert sub(2, 3) == -1\n")
HIDDEN_TESTS = ("from calc.ops import mul\n\n\ndef test_mul():\n    assert mul(3, 4) == 12\n\n\n"
                "def test_mul_zero():\n    assert mul(5, 0) == 0\n")
F2P = ("tests/test_mul.py::test_mul", "tests/test_mul.py::test_mul_zero")
P2P = ("tests/test_ops.py::test_add", "tests/test_ops.py::test_sub")


def edit(old: str, new: str) -> str:
    """A submission that replaces ``old`` with ``new`` in calc/ops.py."""
    assert old in OPS
    return unified_diff(OPS, OPS.replace(old, new), "calc/ops.py")


FIX = edit("def mul(a, b):\n    return a + b", "def mul(a, b):\n    return a * b")


@pytest.fixture(scope="module")
def instance(tmp_path_factory) -> SWEInstance:
    """A tiny repository whose ``mul`` is wrong; the tests of ``mul`` come with the test patch."""
    repo = write_calc_repo(tmp_path_factory.mktemp("calc"), OPS, VISIBLE_TESTS)
    return SWEInstance(instance_id="calc__mul-1", repo="orchard/calc", base_commit="0" * 40,
                       problem_statement="mul adds", patch=FIX,
                       test_patch=new_file_diff(HIDDEN_TESTS, "tests/test_mul.py"),
                       FAIL_TO_PASS=F2P, PASS_TO_PASS=P2P, repo_path=repo)


@pytest.fixture(scope="module")
def workspace(sandbox, instance):
    return sandbox.run_async(setup_workspace, instance)  # the async set-up, from sync code


@pytest.fixture
def graded(sandbox, instance, workspace):
    """Grade a submission on the repository reset to its base (SWE-bench grades a clean checkout)."""
    def run(patch: str, task: SWEInstance = instance):
        sandbox.run_async(reset_workspace)
        return sandbox.run_async(grade_submission, task, patch, workspace)
    return run


def statuses(result) -> dict[str, str]:
    return {t.test: t.status for t in result.tests}


def test_setup_makes_the_repository_runnable_offline(sandbox, workspace):
    assert workspace.repo_dir == "/workspace/repo" and workspace.shims
    probe = sandbox.exec(f"{workspace.python} -c 'import pytest, calc.ops'", env=workspace.env)
    assert probe.ok, probe.stderr
    plain = sandbox.exec("pytest -q && python -c 'import calc.ops; print(calc.ops.__file__)'", cwd="/workspace/repo")
    assert plain.ok and "2 passed" in plain.stdout and "/workspace/repo/calc/ops.py" in plain.stdout
    clean = sandbox.exec("git status --porcelain && git rev-parse orchard-base", cwd="/workspace/repo")
    assert clean.ok and clean.stdout.count("\n") == 1  # nothing changed since the tagged base commit


def test_the_fix_resolves(graded):
    result = graded(FIX)
    assert result.resolved and result.reward == 1.0 and result.reason is None
    assert statuses(result) == dict.fromkeys(F2P + P2P, "passed")
    assert result.counts() == {"fail_to_pass_passed": 2, "fail_to_pass_total": 2,
                               "pass_to_pass_passed": 2, "pass_to_pass_total": 2}


def test_no_fix_and_a_partial_fix_do_not_resolve(graded):
    empty = graded("")
    assert not empty.resolved and empty.reason is None
    assert statuses(empty) == {**dict.fromkeys(F2P, "failed"), **dict.fromkeys(P2P, "passed")}
    assert "assert 7 == 12" in next(t.message for t in empty.tests if t.test == F2P[0])
    partial = graded(edit("def mul(a, b):\n    return a + b", "def mul(a, b):\n    return a * b if b else 1"))
    assert not partial.resolved
    assert statuses(partial) == {F2P[0]: "passed", F2P[1]: "failed", **dict.fromkeys(P2P, "passed")}


def test_breaking_a_pass_to_pass_test_does_not_resolve(graded):
    fixed_but_broken = OPS.replace("return a - b", "return a + b").replace(
        "def mul(a, b):\n    return a + b", "def mul(a, b):\n    return a * b")
    result = graded(unified_diff(OPS, fixed_but_broken, "calc/ops.py"))
    assert not result.resolved
    assert statuses(result) == {**dict.fromkeys(F2P, "passed"), P2P[0]: "passed", P2P[1]: "failed"}


def test_a_test_missing_from_the_results_counts_as_failed(graded, instance):
    extra = replace(instance, FAIL_TO_PASS=(*F2P, "tests/test_mul.py::test_gone"))
    result = graded(FIX, extra)
    assert not result.resolved
    assert statuses(result)["tests/test_mul.py::test_gone"] == "missing"
    assert sum(t.passed for t in result.tests) == 4


def test_a_patch_that_does_not_apply_is_not_resolved(graded):
    stale = FIX.replace("-    return a + b", "-    return a ++ b")
    result = graded(stale)
    assert not result.resolved and result.reason == "patch_does_not_apply" and not result.tests
    assert "calc/ops.py" in result.detail


def test_a_submission_cannot_replace_the_tests(graded):
    fake_tests = new_file_diff("def test_mul():\n    pass\n\n\ndef test_mul_zero():\n    pass\n", "tests/test_mul.py")
    result = graded(fake_tests)  # the test patch puts the real tests back
    assert not result.resolved and result.reason is None
    assert statuses(result) == {**dict.fromkeys(F2P, "failed"), **dict.fromkeys(P2P, "passed")}


def test_the_harness_flow_edit_diff_grade_in_a_fresh_sandbox(client, sandbox, instance, workspace):
    sandbox.run_async(reset_workspace)
    sandbox.write_file("/workspace/repo/calc/ops.py", OPS.replace("def mul(a, b):\n    return a + b",
                                                                   "def mul(a, b):\n    return a * b"))
    sandbox.write_file("/workspace/repo/notes.txt", "scratch\n")
    patch = sandbox.run_async(submission_patch)
    assert "calc/ops.py" in patch and "notes.txt" in patch
    assert client.run_async(grade_in_fresh_sandbox, instance, patch, memory="512Mi").resolved


def test_setup_from_a_tarball(client, instance, tmp_path):
    archive = tmp_path / "calc.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        tar.add(instance.repo_path, arcname="calc-1.0")  # one top-level directory: unpacked from inside it
    tarred = replace(instance, repo_path=str(archive))
    assert client.run_async(grade_in_fresh_sandbox, tarred, FIX, memory="512Mi").resolved


def test_setup_and_grade_refuse_clearly(client, instance, tmp_path):
    with client.create(memory="256Mi") as fresh:
        with pytest.raises(SetupError, match="run setup first"):
            fresh.run_async(grade_submission, instance, FIX)
        with pytest.raises(SetupError, match="has no repo_path"):
            fresh.run_async(setup_workspace, replace(instance, repo_path=None))
        junk = tmp_path / "x.tar"
        junk.write_text("junk")
        with pytest.raises(SetupError, match="neither a directory nor a readable tarball"):
            fresh.run_async(setup_workspace, replace(instance, repo_path=str(junk)))
        # Debian's own interpreter has no pytest; a command that is not there is no better
        for python in ("/usr/bin/python3", "no-such-python"):
            with pytest.raises(SetupError, match=f"no Python with pytest in the sandbox \\(tried {python}\\)"):
                fresh.run_async(setup_workspace, instance, python=python)

async def test_async_evaluation_of_a_generated_bug(orchestrator, tmp_path):
    [bug] = generate(shipped_source("minicalc"), 1, str(tmp_path), seed=5)
    async with orchestrator.async_client() as aclient:
        gold = await grade_in_fresh_sandbox(aclient, bug, bug.patch, memory="512Mi")
        empty = await grade_in_fresh_sandbox(aclient, bug, "", memory="512Mi")
    assert gold.resolved, gold.log[-3000:]
    assert not empty.resolved and {t.test for t in empty.tests if not t.passed} == set(bug.FAIL_TO_PASS)


def test_a_missing_report_fails_the_grade_with_its_reason(graded, instance):
    no_report = replace(instance, test_cmd="{python} -c 'print(\"PASSED tests/test_mul.py::test_mul\")' #")
    result = graded(FIX, no_report)  # prints a passing summary line but writes no report
    assert not result.resolved and result.reason == "report_missing"


def test_an_oversized_report_fails_the_grade(graded, monkeypatch):
    from orchard.tasks.swe import grading

    monkeypatch.setattr(grading, "REPORT_MAX_BYTES", 64)
    result = graded(FIX)
    assert not result.resolved and result.reason == "report_too_large"


def test_protected_paths_are_the_tests_their_directories_and_pytest_config(instance):
    from orchard.tasks.swe.grading import protected

    changed = ["calc/ops.py", "tests/test_ops.py", "tests/helpers.py", "conftest.py", "calc/conftest.py",
               "pytest.ini", "setup.cfg", "pyproject.toml", "calc/sitecustomize.py", "x.pth", "docs/tests.md"]
    assert protected(instance, changed) == ["calc/conftest.py", "calc/sitecustomize.py", "conftest.py",
                                            "pyproject.toml", "pytest.ini", "setup.cfg", "tests/helpers.py",
                                            "tests/test_ops.py", "x.pth"]
