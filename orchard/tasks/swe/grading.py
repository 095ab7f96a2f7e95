"""Grade a submission with SWE-bench's rules, in a sandbox set up by :mod:`orchard.tasks.swe.workspace`.

:func:`grade_submission` runs on a sandbox whose repository is still at its base: a pristine copy
of the task's set-up that the policy never touched (the SWE family grades in one:
:attr:`~orchard.harness.task.TaskFamily.pristine_grading`), as SWE-bench grades in a fresh
container. Nothing the policy left behind (files outside the repository, a pre-written report, a
background process) is there; only the submitted diff comes across.

1. Apply the submission (a unified diff) with the sandbox's ``apply_patch`` (``git apply``,
   then ``patch --fuzz``, all or nothing). A patch that does not apply: not resolved, with the
   rejected hunks as the reason. An empty submission applies trivially and is graded as is.
2. **Discard what the submission may not change** (:func:`protected`): the files holding the
   instance's FAIL_TO_PASS and PASS_TO_PASS tests, visible or hidden, everything else under the
   directories that hold them (helpers, ``__init__.py``), the test patch's files, and every file
   that configures or extends pytest or the interpreter wherever it sits (``conftest.py``,
   ``pytest.ini``, ``tox.ini``, ``setup.cfg``, ``pyproject.toml``, ``sitecustomize.py``,
   ``usercustomize.py``, ``*.pth``). Each is put back as it was at the base, or deleted where the
   base lacks it. The paper's SWE-bench formulation grades against the gold tests, so a change
   to them is discarded, not punished: the rest of the submission is graded as if it had not
   been made, and the discarded paths are recorded (:attr:`GradeResult.discarded`). Then the
   test patch is applied.
3. **Scan what the submission adds** to the files the grader keeps (:mod:`~.tampering`): code that
   reaches for the test machinery (pytest or its internals, exit hooks, an early exit, the
   interpreter's state, its callers' frames, the test files, code built at run time) is graded
   ``tampering`` without running the tests.
4. Run the files that hold the FAIL_TO_PASS and PASS_TO_PASS tests with pytest and the verdict plugin
   (:mod:`~.verdict_plugin`), loaded before any conftest or code under test. Each test's verdict
   comes over a file descriptor of the plugin's, written to a directory made for this grade under a
   random name, each line carrying a nonce the plugin takes out of the environment before the code
   under test runs, the stream closed before any ``atexit`` handler of the tested code. No report
   file is read. A stream that is missing or incomplete (pytest killed, exited early, never
   started), oversized or not this run's is a failed grade with that reason, never a pass; one where
   the plugin saw the report machinery changed (pytest's runner or report class patched, a report
   hook registered by anything but pytest, the plugin or a restored ``conftest.py``) is graded
   ``tampering``.
5. Resolved iff every FAIL_TO_PASS and every PASS_TO_PASS test passed (``passed`` or
   ``xfailed``). A test missing from the results counts as failed, and so does a skipped one:
   stricter than SWE-bench, which leaves skipped tests out of its counts, so that a submission
   cannot resolve a task by making its tests skip.

What this does not stop: code under test that forges the plugin's own lines, nonce and all, found by
introspecting its process. The scan of step 3 flags the means such code needs (frames, the heap,
the interpreter's state, code built at run time); a verdict from a process the tested code cannot
reach at all would need the tests to call it across a process boundary.

:func:`grade_in_fresh_sandbox` does it all in a fresh sandbox: create, set up, grade, delete. Both are
coroutines over the async SDK; sync callers use ``sandbox.run_async(grade_submission, ...)``.
"""

from __future__ import annotations

import os
import posixpath
import secrets
import shlex
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from orchard.env import PathNotFound
from orchard.tasks.swe.diffs import patched_files
from orchard.tasks.swe.instance import SWEInstance
from orchard.tasks.swe.tampering import scan_submission
from orchard.tasks.swe.testlog import TestResult, parse_verdict, pytest_command
from orchard.tasks.swe.workspace import (
    BASE_TAG,
    REPO_DIR,
    SetupError,
    Workspace,
    load_workspace,
    setup_workspace,
)

REPORT_PARENT = "/tmp"
REPORT_MAX_BYTES = 16 << 20  # the verdicts of thousands of tests, their failure messages cut, are a few MiB
VERDICT_PLUGIN = os.path.join(os.path.dirname(os.path.abspath(__file__)), "verdict_plugin.py")
VERDICT_FD = 3
LOG_TAIL = 20_000
# Files that configure or extend pytest or the interpreter, wherever they sit in the repository.
PYTEST_FILES = frozenset({"conftest.py", "pytest.ini", "tox.ini", "setup.cfg", "pyproject.toml", "sitecustomize.py",
                          "usercustomize.py"})
Reason = Literal["patch_does_not_apply", "test_patch_does_not_apply", "tests_timed_out", "report_missing",
                 "report_too_large", "report_malformed", "tampering"]


@dataclass(frozen=True)
class TestOutcome:
    test: str
    group: Literal["FAIL_TO_PASS", "PASS_TO_PASS"]
    status: str  # pytest's status, or "missing" when the test is not in the results
    passed: bool
    message: str = ""

    __test__ = False  # not a pytest test class


@dataclass(frozen=True)
class GradeResult:
    instance_id: str
    resolved: bool
    reason: Reason | None = None  # why the tests did not run (or did not finish); None when they ran
    detail: str = ""  # patch tool output or rejected hunks for the reasons above
    tests: tuple[TestOutcome, ...] = ()
    log: str = ""  # the end of the test run's output
    other_results: dict[str, str] = field(default_factory=dict)  # statuses of tests in neither list
    discarded: tuple[str, ...] = ()  # paths the submission changed that the grader put back (see step 2)

    @property
    def reward(self) -> float:
        return 1.0 if self.resolved else 0.0

    def counts(self) -> dict[str, int]:
        """Passed and total per group: ``fail_to_pass_passed``, ``fail_to_pass_total``, ...."""
        out: dict[str, int] = {}
        for group in ("FAIL_TO_PASS", "PASS_TO_PASS"):
            tests = [t for t in self.tests if t.group == group]
            out[f"{group.lower()}_passed"] = sum(t.passed for t in tests)
            out[f"{group.lower()}_total"] = len(tests)
        return out

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "reward": self.reward, **self.counts()}


def _rejected(response: Any) -> str:
    hunks = "".join(f"--- {h.file} {h.header}\n{h.text}" for h in response.rejected)
    return f"{response.output.strip()}\n{hunks}".strip()


def protected(instance: SWEInstance, paths: Iterable[str]) -> list[str]:
    """The ``paths`` (repository-relative) a submission may not change for ``instance`` (step 2)."""
    tests = {*instance.test_files, *patched_files(instance.test_patch)}
    test_dirs = {posixpath.dirname(path) for path in tests} - {""}  # a test at the root protects only itself
    def guarded(path: str) -> bool:
        name = posixpath.basename(path)
        return (path in tests or name in PYTEST_FILES or name.endswith(".pth")
                or any(path.startswith(directory + "/") for directory in test_dirs))
    return sorted(path for path in set(paths) if guarded(path))


async def _discard_protected(sandbox: Any, instance: SWEInstance, repo: str) -> tuple[str, ...]:
    """Put back (or delete) every protected path the applied submission changed; return them."""
    listed = await sandbox.exec(f"git diff --name-only --no-renames -z {BASE_TAG} && git ls-files --others -z",
                                cwd=repo, timeout=120)
    if not listed.ok or listed.truncated:
        raise SetupError(f"could not list the submission's changes: {listed.stderr[-2000:]}")
    paths = protected(instance, filter(None, listed.stdout.split("\0")))
    if paths:
        restore = " && ".join(
            f"{{ rm -rf -- {p} && {{ ! git cat-file -e {BASE_TAG}:{p} 2>/dev/null || git checkout -q {BASE_TAG} -- {p}; }}; }}"
            for p in map(shlex.quote, paths))
        result = await sandbox.exec(restore, cwd=repo, timeout=120)
        if not result.ok:
            raise SetupError(f"could not restore the protected files to {BASE_TAG}: {result.stderr[-2000:]}")
    return tuple(paths)


async def _read_verdicts(sandbox: Any, path: str, nonce: str) -> tuple[dict[str, TestResult], Reason | None, str]:
    """The verdict plugin's results, or why there are none (missing, too large, malformed, tampering) and a
    detail."""
    try:
        info = await sandbox.stat(path)
    except PathNotFound:
        return {}, "report_missing", "the tests never ran"
    if info.type != "file" or info.size > REPORT_MAX_BYTES:
        return {}, "report_too_large", f"the verdicts are a {info.type} of {info.size} bytes (cap {REPORT_MAX_BYTES})"
    text = (await sandbox.read_file(path)).decode("utf-8", "replace")
    return parse_verdict(text, nonce)


def _with_plugin(env: dict[str, str], plugin_dir: str, nonce: str) -> dict[str, str]:
    """``env`` with the verdict plugin importable and loaded first, and its nonce and descriptor."""
    path = ":".join(filter(None, (plugin_dir, env.get("PYTHONPATH", ""))))
    addopts = " ".join(filter(None, ("-p orchard_verdict", env.get("PYTEST_ADDOPTS", ""))))
    return {**env, "PYTHONPATH": path, "PYTEST_ADDOPTS": addopts, "ORCHARD_VERDICT_NONCE": nonce,
            "ORCHARD_VERDICT_FD": str(VERDICT_FD)}


def judge(instance: SWEInstance, results: dict[str, TestResult]) -> tuple[bool, tuple[TestOutcome, ...]]:
    """SWE-bench's verdict on per-test results: every listed test must pass; missing ones fail."""
    outcomes = []
    for group, tests in (("FAIL_TO_PASS", instance.FAIL_TO_PASS), ("PASS_TO_PASS", instance.PASS_TO_PASS)):
        for test in tests:
            result = results.get(test)
            if result is None:
                outcomes.append(TestOutcome(test, group, "missing", False))
            else:
                outcomes.append(TestOutcome(test, group, result.status, result.passed, result.message[:2000]))
    return all(o.passed for o in outcomes) and bool(outcomes), tuple(outcomes)


async def grade_submission(sandbox: Any, instance: SWEInstance, submission_patch: str, workspace: Workspace | None = None,
                 timeout: float = 900.0, repo_dir: str = REPO_DIR) -> GradeResult:
    """Grade ``submission_patch`` for ``instance`` in ``sandbox`` (an ``AsyncSandbox`` set up for it).

    ``workspace`` defaults to what setup saved in the sandbox at ``repo_dir``. ``timeout`` bounds
    the test run; a run that exceeds it is not resolved (reason ``tests_timed_out``).
    """
    if not instance.FAIL_TO_PASS:
        raise ValueError(f"instance {instance.instance_id!r} has no FAIL_TO_PASS tests: nothing to grade")
    workspace = workspace or await load_workspace(sandbox, repo_dir)
    repo = workspace.repo_dir
    if submission_patch.strip():
        applied = await sandbox.apply_patch(submission_patch, cwd=repo)
        if not applied.applied:
            return GradeResult(instance.instance_id, False, "patch_does_not_apply", _rejected(applied))
    discarded = await _discard_protected(sandbox, instance, repo)
    findings = scan_submission(submission_patch, protected(instance, patched_files(submission_patch)))
    if findings:
        return GradeResult(instance.instance_id, False, "tampering", "\n".join(f.describe() for f in findings)[:4000],
                           discarded=discarded)
    if instance.test_patch.strip():
        applied = await sandbox.apply_patch(instance.test_patch, cwd=repo)
        if not applied.applied:
            return GradeResult(instance.instance_id, False, "test_patch_does_not_apply", _rejected(applied),
                               discarded=discarded)
    report_dir, nonce = f"{REPORT_PARENT}/orchard-grade-{secrets.token_hex(8)}", secrets.token_hex(16)
    verdict_path = f"{report_dir}/verdicts.jsonl"
    made = await sandbox.exec(f"mkdir -m 700 {report_dir}", timeout=60)
    if not made.ok:
        raise SetupError(f"could not make the grade's directory: {made.stderr[-2000:]}")
    with open(VERDICT_PLUGIN, "rb") as plugin:
        await sandbox.write_file(f"{report_dir}/orchard_verdict.py", plugin.read())
    command = pytest_command(instance.test_cmd, workspace.python, None, instance.test_files)
    run = await sandbox.exec(f"{VERDICT_FD}>{verdict_path} {command}", cwd=repo,
                             env=_with_plugin(workspace.env, report_dir, nonce), timeout=timeout)
    results, reason, detail = await _read_verdicts(sandbox, verdict_path, nonce)
    if run.timed_out:
        reason, detail = "tests_timed_out", run.stderr[-LOG_TAIL:]
    resolved, outcomes = judge(instance, results)
    listed = set(instance.FAIL_TO_PASS) | set(instance.PASS_TO_PASS)
    others = {test: r.status for test, r in results.items() if test not in listed}
    return GradeResult(instance.instance_id, resolved and reason is None, reason, detail, outcomes,
                       run.stdout[-LOG_TAIL:], others, discarded)


async def grade_in_fresh_sandbox(client: Any, instance: SWEInstance, submission_patch: str, timeout: float = 900.0,
                    **sandbox_spec: Any) -> GradeResult:
    """Grade in a fresh sandbox of ``client`` (an ``AsyncSandboxClient``), deleted afterwards."""
    async with client.create(**sandbox_spec) as sandbox:
        workspace = await setup_workspace(sandbox, instance)
        return await grade_submission(sandbox, instance, submission_patch, workspace, timeout=timeout)
