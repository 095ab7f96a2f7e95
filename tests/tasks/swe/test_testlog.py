"""Per-test results from a real pytest run: JUnit report first, the -rA summary as fallback."""

from __future__ import annotations

import subprocess
import sys

import pytest

from orchard.tasks.swe.testlog import PYTEST_ENV, parse_junit, parse_results, parse_summary, pytest_command

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
