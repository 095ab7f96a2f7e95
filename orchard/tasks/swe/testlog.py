"""pytest results, per test: the command that produces them and the parsers that read them.

Two sources, both produced by one run (:func:`pytest_command`):

* a JUnit XML report (``--junitxml`` with ``junit_family=xunit1``, whose ``file`` attribute gives
  back the exact node id). This is the primary source: it is structured, it records setup and
  teardown errors on the test they belong to, and its failure messages feed problem statements.
* the ``-rA`` short summary (``PASSED path::test``, ``FAILED path::test - message``), the
  lines SWE-bench's own log parsers read. It is the fallback when the report is missing, e.g.
  when pytest was killed or a custom ``test_cmd`` dropped the flag.

When a test appears more than once (a test that passed but whose teardown failed is both
``PASSED`` and ``ERROR`` in the summary), the worst status wins. A test missing from both
sources has no status; graders count it as failed.

The grader reads neither: its verdicts come from :mod:`orchard.tasks.swe.verdict_plugin` over a file
descriptor of their own, read by :func:`parse_verdict`.

Statuses are pytest's words: ``passed``, ``failed``, ``error``, ``skipped``, ``xfailed``,
``xpassed``. Only ``passed`` and ``xfailed`` count as passing (SWE-bench's rule).
"""

from __future__ import annotations

import json
import re
import shlex
import xml.etree.ElementTree as ET
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import defusedxml.ElementTree
from defusedxml import DefusedXmlException

PASSING = frozenset({"passed", "xfailed"})
# From best to worst: a later status replaces an earlier one for the same test.
_RANK = {"passed": 0, "xfailed": 1, "skipped": 2, "xpassed": 3, "failed": 4, "error": 5}
_SUMMARY = re.compile(r"^(PASSED|FAILED|ERROR|XFAIL|XPASS|SKIPPED) (.+)$")
_SUMMARY_STATUS = {"PASSED": "passed", "FAILED": "failed", "ERROR": "error", "XFAIL": "xfailed",
                   "XPASS": "xpassed", "SKIPPED": "skipped"}

# Plugins installed next to pytest (in the orchestrator's venv: schemathesis, pytest-asyncio,
# ...) are not loaded: they triple pytest's start-up time and make results depend on the host.
PYTEST_ENV = {"PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1", "PYTHONDONTWRITEBYTECODE": "1"}


@dataclass(frozen=True)
class TestResult:
    status: str
    message: str = ""  # the failure or error message pytest reported (empty when it passed)

    __test__ = False  # not a pytest test class

    @property
    def passed(self) -> bool:
        return self.status in PASSING


def pytest_command(test_cmd: str, python: str, report_path: str | None, test_files: Iterable[str]) -> str:
    """The shell command that runs ``test_files`` and writes the JUnit report (none without ``report_path``).

    ``test_cmd`` is the instance's command with ``{python}`` standing for the interpreter. The
    cache provider is off so that a run leaves no ``.pytest_cache`` in the repository, and
    ``--rootdir=.`` keeps node ids relative to the repository root wherever pytest's ini search
    would have put it. With ``--continue-on-collection-errors`` a test file that fails to import
    costs only its own tests (missing, so failed), not the whole run.
    """
    command = test_cmd.replace("{python}", shlex.quote(python))
    flags = ["-rA", "-p", "no:cacheprovider", "--rootdir=.", "--continue-on-collection-errors"]
    if report_path is not None:
        flags += ["-o", "junit_family=xunit1", f"--junitxml={report_path}"]
    return " ".join([command, *map(shlex.quote, flags), *map(shlex.quote, test_files)])


def _worse(old: TestResult | None, new: TestResult) -> TestResult:
    return new if old is None or _RANK[new.status] >= _RANK[old.status] else old


def _dotted(path: str) -> str:
    return path[:-3].replace("/", ".") if path.endswith(".py") else path.replace("/", ".")


def _node_id(case: ET.Element) -> str | None:
    """Rebuild ``path::Class::name`` from an xunit1 testcase (``file``, ``classname``, ``name``)."""
    name, classname, path = case.get("name"), case.get("classname", ""), case.get("file")
    if not name:
        return None
    if not path:  # xunit2: the path is lost; guess it from the dotted class name
        return f"{classname.replace('.', '/')}.py::{name}" if classname else None
    module = _dotted(path)
    classes = classname[len(module) + 1:] if classname.startswith(module + ".") else ""
    return "::".join([path, *(classes.split(".") if classes else []), name])


def parse_junit(xml_text: str | bytes) -> dict[str, TestResult]:
    """Per-test results from a JUnit XML report; raises ``ValueError`` when it is not one.

    Parsed with ``defusedxml``: a report with a DTD, entities or external references (a billion
    laughs, a file read through an entity) is refused as malformed, whoever wrote it.
    """
    try:
        root = defusedxml.ElementTree.fromstring(xml_text, forbid_dtd=True)
    except (ET.ParseError, DefusedXmlException) as exc:
        raise ValueError(f"not a JUnit XML report: {type(exc).__name__}: {exc}") from None
    if root.tag not in ("testsuites", "testsuite"):
        raise ValueError(f"not a JUnit XML report: root element <{root.tag}>")
    results: dict[str, TestResult] = {}
    for case in root.iter("testcase"):
        node_id = _node_id(case)
        if node_id is None:
            continue
        status, message = "passed", ""
        for child in case:
            if child.tag in ("failure", "error"):
                message = child.get("message") or (child.text or "").strip()
                status = "xpassed" if message.startswith("[XPASS(strict)]") else child.tag.replace("failure", "failed")
                break
            if child.tag == "skipped":
                status = "xfailed" if child.get("type") == "pytest.xfail" else "skipped"
                message = child.get("message", "")
        if not case.get("classname"):  # a collection error, reported as a "test" named after the module
            continue
        results[node_id] = _worse(results.get(node_id), TestResult(status, message))
    return results


def _split_summary(rest: str) -> tuple[str, str]:
    """``path::test[params] - message`` into the node id and the message.

    Parameters may hold spaces and `` - `` themselves, so a node id with an open ``[`` runs to
    the first ``]`` that ends the line or is followed by `` - ``.
    """
    token = rest.split(" ", 1)[0]
    if "[" in token and not token.endswith("]"):
        for index, char in enumerate(rest):
            if char == "]" and (index + 1 == len(rest) or rest.startswith(" - ", index + 1)):
                return rest[: index + 1], rest[index + 4:]
    node_id, _, message = rest.partition(" - ")
    return node_id.strip(), message


def parse_summary(log: str) -> dict[str, TestResult]:
    """Per-test results from the ``-rA`` short test summary lines of a pytest log.

    ``SKIPPED`` lines name a location (``[1] path:line: reason``), not a test, and are ignored.
    """
    results: dict[str, TestResult] = {}
    for line in log.splitlines():
        match = _SUMMARY.match(line.rstrip())
        if not match or match.group(1) == "SKIPPED":
            continue
        node_id, message = _split_summary(match.group(2))
        if "::" not in node_id:  # a collection error names a file, not a test
            continue
        status = _SUMMARY_STATUS[match.group(1)]
        result = TestResult("xpassed" if message.startswith("[XPASS(strict)]") else status, message)
        results[node_id] = _worse(results.get(node_id), result)
    return results


def parse_results(xml_text: str | bytes | None, log: str) -> dict[str, TestResult]:
    """The report's results when there is a readable report, else the summary lines of ``log``."""
    if xml_text:
        try:
            results = parse_junit(xml_text)
        except ValueError:
            results = {}
        if results:
            return results
    return parse_summary(log)


def passing(results: Mapping[str, TestResult]) -> set[str]:
    return {test for test, result in results.items() if result.passed}


def _phase_status(line: dict) -> str:
    """A verdict line's status in pytest's words (a phase's report, as the JUnit report counts it)."""
    outcome, when, xfail = line.get("outcome"), line.get("when"), bool(line.get("wasxfail"))
    if outcome == "passed":
        return "xpassed" if xfail and when == "call" else "passed"
    if outcome == "skipped":
        return "xfailed" if xfail else "skipped"
    return "failed" if when == "call" else "error"


def parse_verdict(text: str, nonce: str) -> tuple[dict[str, TestResult], str | None, str]:
    """Per-test results from the verdict plugin's lines, or why there are none: ``report_missing`` (no
    complete stream: pytest killed, exited early, or never loaded the plugin), ``report_malformed`` (a
    line that is not this run's, out of order, or anything after ``end``) or ``tampering`` (the plugin
    saw the machinery that makes reports changed, or a report of another class). The third item says
    what was found."""
    lines = []
    for number, raw in enumerate(text.splitlines()):
        try:
            line = json.loads(raw)
        except ValueError:
            return {}, "report_malformed", f"line {number} is not JSON: {raw[:200]!r}"
        if not isinstance(line, dict) or line.get("nonce") != nonce or line.get("seq") != number:
            return {}, "report_malformed", f"line {number} is not this run's plugin's: {raw[:200]!r}"
        lines.append(line)
    ends = [n for n, line in enumerate(lines) if line.get("kind") == "end"]
    if not lines or lines[0].get("kind") != "start" or not ends:
        return {}, "report_missing", "no complete verdict stream (pytest killed, exited early or never started)"
    if ends[0] != len(lines) - 1:
        return {}, "report_malformed", f"{len(lines) - 1 - ends[0]} lines after the end of the run"
    tampered = [line for line in lines if line.get("kind") == "tampered"]
    forged = [line["nodeid"] for line in lines if line.get("kind") == "report" and not line.get("genuine")]
    if tampered or forged:
        found = [f"{line.get('where')}: changed {line.get('changed')}, foreign hooks {line.get('foreign')}"
                 for line in tampered] + [f"a report not made by pytest for {nodeid}" for nodeid in forged]
        return {}, "tampering", "; ".join(found)[:4000]
    results: dict[str, TestResult] = {}
    for line in lines:
        if line.get("kind") == "report":
            status = _phase_status(line)
            results[line["nodeid"]] = _worse(results.get(line["nodeid"]), TestResult(status, line.get("message", "")))
    return results, None, ""
