"""Grade a submission with SWE-bench's rules, in a sandbox set up by :mod:`orchard.tasks.swe.workspace`.

:func:`grade_submission`, on a sandbox whose repository is still at its base (a fresh sandbox after
:func:`~orchard.tasks.swe.workspace.setup_workspace`, as SWE-bench grades in a fresh container):

1. Apply the submission (a unified diff) with the sandbox's ``apply_patch`` (``git apply``,
   then ``patch --fuzz``, all or nothing). A patch that does not apply: not resolved, with the
   rejected hunks as the reason. An empty submission applies trivially and is graded as is.
2. Restore every file the test patch touches to the base (or delete it where the base lacks it),
   like SWE-bench's ``git checkout <base> -- <test files>``, so a submission cannot pre-empt or
   change the tests; then apply the test patch.
3. Run the files that hold the FAIL_TO_PASS and PASS_TO_PASS tests with pytest, reading results
   per test from a JUnit report, with the ``-rA`` summary as a fallback (:mod:`.testlog`).
4. Resolved iff every FAIL_TO_PASS and every PASS_TO_PASS test passed (``passed`` or
   ``xfailed``). A test missing from the results counts as failed, and so does a skipped one:
   stricter than SWE-bench, which leaves skipped tests out of its counts, so that a submission
   cannot resolve a task by making its tests skip.

:func:`grade_in_fresh_sandbox` does it all in a fresh sandbox: create, set up, grade, delete. Both are
coroutines over the async SDK; sync callers use ``sandbox.run_async(grade_submission, ...)``.
"""

from __future__ import annotations

import shlex
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from orchard.env import PathNotFound
from orchard.tasks.swe.diffs import patched_files
from orchard.tasks.swe.instance import SWEInstance
from orchard.tasks.swe.testlog import TestResult, parse_results, pytest_command
from orchard.tasks.swe.workspace import (
    BASE_TAG,
    REPO_DIR,
    SetupError,
    Workspace,
    load_workspace,
    setup_workspace,
)

REPORT_PATH = "/tmp/orchard-swe/report.xml"
LOG_TAIL = 20_000
Reason = Literal["patch_does_not_apply", "test_patch_does_not_apply", "tests_timed_out"]


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
    if instance.test_patch.strip():
        restore = " && ".join(
            f"{{ git checkout -q {BASE_TAG} -- {p} 2>/dev/null || rm -rf {p}; }}"
            for p in map(shlex.quote, patched_files(instance.test_patch)))
        result = await sandbox.exec(restore or "true", cwd=repo, timeout=120)
        if not result.ok:
            raise SetupError(f"could not restore the test files to {BASE_TAG}: {result.stderr[-2000:]}")
        applied = await sandbox.apply_patch(instance.test_patch, cwd=repo)
        if not applied.applied:
            return GradeResult(instance.instance_id, False, "test_patch_does_not_apply", _rejected(applied))
    command = pytest_command(instance.test_cmd, workspace.python, REPORT_PATH, instance.test_files)
    run = await sandbox.exec(f"rm -f {REPORT_PATH} && mkdir -p {REPORT_PATH.rsplit('/', 1)[0]} && {command}",
                             cwd=repo, env=workspace.env, timeout=timeout)
    try:
        report = await sandbox.read_file(REPORT_PATH)
    except PathNotFound:  # pytest died before writing it: fall back to the log
        report = None
    results = parse_results(report, run.stdout)
    resolved, outcomes = judge(instance, results)
    listed = set(instance.FAIL_TO_PASS) | set(instance.PASS_TO_PASS)
    others = {test: r.status for test, r in results.items() if test not in listed}
    reason: Reason | None = "tests_timed_out" if run.timed_out else None
    return GradeResult(instance.instance_id, resolved and not run.timed_out, reason,
                       run.stderr[-LOG_TAIL:] if run.timed_out else "", outcomes,
                       run.stdout[-LOG_TAIL:], others)


async def grade_in_fresh_sandbox(client: Any, instance: SWEInstance, submission_patch: str, timeout: float = 900.0,
                    **sandbox_spec: Any) -> GradeResult:
    """Grade in a fresh sandbox of ``client`` (an ``AsyncSandboxClient``), deleted afterwards."""
    async with client.create(**sandbox_spec) as sandbox:
        workspace = await setup_workspace(sandbox, instance)
        return await grade_submission(sandbox, instance, submission_patch, workspace, timeout=timeout)
