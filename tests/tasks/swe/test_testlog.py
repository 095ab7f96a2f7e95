"""Per-test results from a real pytest run: JUnit report first, the -rA summary as fallback; and the
grader's verdict plugin's stream, checked line by line."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pytest

from orchard.tasks.swe.grading import VERDICT_PLUGIN
from orchard.tasks.swe.testlog import (
    PYTEST_ENV,
    parse_junit,
    parse_results,
    parse_summary,
    parse_verdict,
    pytest_command,
)

TESTS = '''
import pytest

@pytest.fixture
def broken_teardown():
    yield
    raise RuntimeError("teardown")

def test_ok(): pass
def test_fail(): assert 1 + 1 == 3, "arithmetic"
def test_teardown_error(broken_teardown): pass
@pytest.mark.xfail
def test_expected_failure(): assert False
@pytest.mark.xfail(strict=True)
def test_strict_xpass(): pass
@pytest.mark.skip("later")
def test_skipped(): pass
@pytest.mark.parametrize("value", ["a - b", "c::d", 1])
def test_param(value): assert value != 1
class TestGroup:
    class TestInner:
        def test_nested(self): pass
'''
EXPECTED = {
    "tests/test_mixed.py::test_ok": "passed",
    "tests/test_mixed.py::test_fail": "failed",
    "tests/test_mixed.py::test_teardown_error": "error",
    "tests/test_mixed.py::test_expected_failure": "xfailed",
    "tests/test_mixed.py::test_strict_xpass": "xpassed",
    "tests/test_mixed.py::test_param[a - b]": "passed",
    "tests/test_mixed.py::test_param[c::d]": "passed",
    "tests/test_mixed.py::test_param[1]": "failed",
    "tests/test_mixed.py::TestGroup::TestInner::test_nested": "passed",
}


@pytest.fixture(scope="module")
def pytest_run(tmp_path_factory):
    """A real pytest run over a file with every outcome, and one over a file that fails to import."""
    repo = tmp_path_factory.mktemp("repo")
    (repo / "tests").mkdir()
    (repo / "tests" / "test_mixed.py").write_text(TESTS)
    (repo / "tests" / "test_broken.py").write_text("import no_such_module\n\ndef test_never(): pass\n")
    report = repo / "report.xml"
    command = pytest_command("{python} -m pytest", sys.executable, str(report), ["tests"])
    run = subprocess.run(command, shell=True, cwd=repo, capture_output=True, text=True,
                         env={"PATH": "/usr/bin:/bin", **PYTEST_ENV})
    return report.read_bytes(), run.stdout


def test_junit_report_gives_every_status_with_exact_node_ids(pytest_run):
    xml, _ = pytest_run
    results = parse_junit(xml)
    skipped = {"tests/test_mixed.py::test_skipped": "skipped"}
    assert {test: r.status for test, r in results.items()} == {**EXPECTED, **skipped}
    assert "arithmetic" in results["tests/test_mixed.py::test_fail"].message
    assert results["tests/test_mixed.py::test_expected_failure"].passed  # SWE-bench counts XFAIL as passing
    assert not results["tests/test_mixed.py::test_strict_xpass"].passed


def test_summary_lines_give_the_same_statuses(pytest_run):
    _, log = pytest_run
    results = parse_summary(log)  # skipped tests name a location there, not a test
    assert {test: r.status for test, r in results.items()} == EXPECTED
    assert results["tests/test_mixed.py::test_fail"].message.startswith("AssertionError: arithmetic")


def test_the_log_is_the_fallback_when_the_report_is_missing_or_broken(pytest_run):
    xml, log = pytest_run
    assert parse_results(xml, "") == parse_junit(xml)
    for report in (None, b"", b"<html>not junit</html>", b"<testsuites><testcase"):
        assert {t: r.status for t, r in parse_results(report, log).items()} == EXPECTED
    with pytest.raises(ValueError, match="not a JUnit XML report"):
        parse_junit(b"<html/>")


def test_a_report_with_a_dtd_or_entities_is_refused_as_malformed():
    laughs = ('<?xml version="1.0"?><!DOCTYPE t [<!ENTITY a "aaaaaaaaaa"><!ENTITY b "&a;&a;&a;&a;&a;&a;">]>'
              '<testsuites><testsuite><testcase classname="t" name="x" file="t.py">&b;</testcase></testsuite>'
              '</testsuites>')
    with pytest.raises(ValueError, match="not a JUnit XML report"):
        parse_junit(laughs)
    external = ('<?xml version="1.0"?><!DOCTYPE t [<!ENTITY e SYSTEM "file:///etc/passwd">]>'
                '<testsuites><testsuite><testcase classname="t" name="x" file="t.py">&e;</testcase></testsuite>'
                '</testsuites>')
    with pytest.raises(ValueError):
        parse_junit(external)


@pytest.fixture(scope="module")
def verdict_run(tmp_path_factory) -> str:
    """The same tests run with the verdict plugin loaded as the grader loads it, its stream on descriptor 3."""
    repo, plugin = tmp_path_factory.mktemp("verdict-repo"), tmp_path_factory.mktemp("plugin")
    (repo / "tests").mkdir()
    (repo / "tests" / "test_mixed.py").write_text(TESTS)
    (repo / "tests" / "test_broken.py").write_text("import no_such_module\n\ndef test_never(): pass\n")
    shutil.copy(VERDICT_PLUGIN, plugin / "orchard_verdict.py")
    stream = repo / "verdicts.jsonl"
    command = f"3>{stream} " + pytest_command("{python} -m pytest", sys.executable, None, ["tests"])
    subprocess.run(command, shell=True, cwd=repo, capture_output=True, text=True, executable="/bin/bash",
                   env={"PATH": "/usr/bin:/bin", **PYTEST_ENV, "PYTHONPATH": str(plugin),
                        "PYTEST_ADDOPTS": "-p orchard_verdict", "ORCHARD_VERDICT_NONCE": "n0nce"})
    return stream.read_text()


def test_the_verdict_stream_gives_the_reports_statuses(verdict_run, pytest_run):
    results, reason, detail = parse_verdict(verdict_run, "n0nce")
    assert reason is None and detail == ""
    junit = {test: r.status for test, r in parse_junit(pytest_run[0]).items()}
    # a strict XPASS is pytest's failure of the call (the JUnit report names it xpassed): neither passes
    assert {test: r.status for test, r in results.items()} == {**junit, "tests/test_mixed.py::test_strict_xpass": "failed"}
    assert "arithmetic" in results["tests/test_mixed.py::test_fail"].message


def test_a_verdict_stream_that_is_not_whole_or_not_this_runs_is_no_verdict(verdict_run):
    lines = verdict_run.splitlines()
    assert parse_verdict(verdict_run, "other")[1] == "report_malformed"  # another run's nonce
    assert parse_verdict("\n".join(lines[:-1]), "n0nce")[1] == "report_missing"  # no end: killed or exited early
    assert parse_verdict("", "n0nce")[1] == "report_missing"
    assert parse_verdict("\n".join(lines[:3] + lines[4:]), "n0nce")[1] == "report_malformed"  # a line dropped
    late = json.dumps({"nonce": "n0nce", "seq": len(lines), "kind": "report", "nodeid": "x", "when": "call",
                       "outcome": "passed", "genuine": True})
    assert parse_verdict("\n".join([*lines, late]), "n0nce")[1] == "report_malformed"  # written after the end
    assert parse_verdict(verdict_run + "not json\n", "n0nce")[1] == "report_malformed"
    forged = [json.loads(line) for line in lines]
    forged[1]["genuine"] = False  # a report of a class pytest did not make
    assert parse_verdict("\n".join(map(json.dumps, forged)), "n0nce")[1] == "tampering"
