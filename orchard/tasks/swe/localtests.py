"""Run a repository's pytest suite in a local directory, for bug generation.

Generation runs thousands of short test runs on trusted code (the repository's own tests against
a mutated copy), so it uses a local subprocess rather than a sandbox: about 0.3 s a run for the
shipped repositories, against a sandbox's extra round trips. The command and the parsing are the
ones grading uses in the sandbox (:mod:`.testlog`), and the interpreter is the orchestrator's own
``sys.executable``, which is the one :func:`orchard.tasks.swe.workspace.setup` picks on the local
backend, so a bug's FAIL_TO_PASS and PASS_TO_PASS lists hold there as here.

A run that exceeds its timeout is killed with its whole process group (mutations make infinite
loops).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass

from orchard.tasks.swe.instance import DEFAULT_TEST_CMD
from orchard.tasks.swe.testlog import PYTEST_ENV, TestResult, parse_results, pytest_command


@dataclass(frozen=True)
class LocalRun:
    results: dict[str, TestResult]
    timed_out: bool
    exit_code: int | None
    log: str


def run_tests(repo_dir: str, test_paths: Sequence[str], timeout: float = 60.0, python: str = sys.executable,
              test_cmd: str = DEFAULT_TEST_CMD) -> LocalRun:
    """Run ``test_paths`` (repository-relative) in ``repo_dir`` with the repository on ``PYTHONPATH``."""
    with tempfile.TemporaryDirectory(prefix="orchard-swe-run-") as scratch:
        report = os.path.join(scratch, "report.xml")
        command = pytest_command(test_cmd, python, report, test_paths)
        env = {**os.environ, **PYTEST_ENV, "PYTHONPATH": os.path.abspath(repo_dir)}
        process = subprocess.Popen(f"exec {command}", shell=True, cwd=repo_dir, env=env, stdout=subprocess.PIPE,
                                   stderr=subprocess.STDOUT, start_new_session=True)
        try:
            out, _ = process.communicate(timeout=timeout)
            timed_out = False
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            out, _ = process.communicate()
            timed_out = True
        xml = None
        if os.path.exists(report):
            with open(report, "rb") as handle:
                xml = handle.read()
        log = out.decode("utf-8", errors="replace")
        return LocalRun(parse_results(xml, log), timed_out, process.returncode, log)
