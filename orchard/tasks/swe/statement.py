"""Problem statements for synthetic bugs, written from the tests the bug breaks.

Like an issue a user files: which tests fail, what they report, and the code of one or two of
them as a reproduction, in a few seeded phrasings. It is built only from test-side facts (test
ids, the failure messages pytest reported, the tests' source), so it never shows the buggy line;
message lines that quote the buggy or the original line of code are dropped as well.
"""

from __future__ import annotations

import ast
import os
import random
import re
import textwrap
from collections.abc import Mapping, Sequence

from orchard.tasks.swe.testlog import TestResult

MAX_LISTED = 8
MAX_EXAMPLES = 2
MAX_MESSAGE_LINES = 12
MAX_SOURCE_LINES = 30

_TITLES = ("{subject}: wrong behaviour", "Wrong result from {subject}", "Regression in {subject}",
           "{subject} is broken")
_INTROS = ("After a recent change, {count} of the tests of `{repo}` fail:",
           "Some tests of `{repo}` started failing ({count} of them):",
           "Running the test suite of `{repo}`, {count} failing:")
_CLOSINGS = ("Everything else in the test suite still passes. Please fix the code (not the tests) so that "
             "these tests pass.",
             "The rest of the suite is fine. The tests describe the intended behaviour: the library should be "
             "changed to match them.",
             "Other tests still pass. Please find and fix the cause in the library; the tests are correct.")
_HIDDEN = ("These tests are not in the checkout you have; they will be added back to check the fix, so "
           "reproduce the problem with your own script or test.")


def _subject(test_id: str) -> str:
    name = re.sub(r"\[.*\]$", "", test_id.split("::")[-1])
    words = name.removeprefix("test_").removeprefix("test").replace("_", " ").strip()
    return f"`{words}`" if words else f"`{name}`"


def source_of_test(repo_dir: str, test_id: str) -> str | None:
    """The source of the test function (with its decorators) that ``test_id`` names, dedented."""
    path, *names = test_id.split("::")
    if not names:
        return None
    names[-1] = re.sub(r"\[.*\]$", "", names[-1])
    try:
        with open(os.path.join(repo_dir, path), encoding="utf-8") as handle:
            text = handle.read()
        body: list[ast.stmt] = ast.parse(text).body
    except (OSError, SyntaxError, ValueError):
        return None
    node: ast.AST | None = None
    for name in names:
        node = next((n for n in body if isinstance(n, ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
                     and n.name == name), None)
        if node is None:
            return None
        body = node.body
    first = min([node.lineno, *(d.lineno for d in node.decorator_list)])
    lines = text.splitlines()[first - 1:node.end_lineno]
    if len(lines) > MAX_SOURCE_LINES:
        lines = [*lines[:MAX_SOURCE_LINES], "    ..."]
    return textwrap.dedent("\n".join(lines))


def _message(result: TestResult, forbidden: Sequence[str]) -> str:
    lines = [line for line in result.message.strip().splitlines()
             if not any(f and f in line for f in forbidden)]
    if len(lines) > MAX_MESSAGE_LINES:
        lines = [*lines[:MAX_MESSAGE_LINES], "..."]
    return "\n".join(lines) or f"(the test {result.status})"


def problem_statement(repo: str, failing: Mapping[str, TestResult | None], sources: Mapping[str, str | None],
                      rng: random.Random, forbidden: Sequence[str] = (), tests_visible: bool = True) -> str:
    """An issue-like description of the failing tests.

    ``failing`` maps test ids to their results in the buggy repository (None when the test did
    not report at all); ``sources`` maps test ids to their code; ``forbidden`` are code lines
    (stripped) that must not appear in the text.
    """
    if not failing:
        raise ValueError("a problem statement needs at least one failing test")
    tests = sorted(failing)
    forbidden = [f.strip() for f in forbidden if len(f.strip()) >= 4]
    parts = [rng.choice(_TITLES).format(subject=_subject(tests[0])), "",
             rng.choice(_INTROS).format(count=len(tests), repo=repo), ""]
    parts += [f"- `{test}`" for test in tests[:MAX_LISTED]]
    if len(tests) > MAX_LISTED:
        parts.append(f"- ... and {len(tests) - MAX_LISTED} more")
    for test in tests[:MAX_EXAMPLES]:
        result = failing[test]
        parts += ["", f"`{test}` fails with:" if result else f"`{test}` does not report a result at all.", ""]
        if result:
            parts += ["```", _message(result, forbidden), "```"]
        source = sources.get(test)
        if source:
            parts += ["", "The test:" if len(tests) == 1 else "Its code:", "", "```python", source, "```"]
    parts += ["", rng.choice(_CLOSINGS)]
    if not tests_visible:
        parts += ["", _HIDDEN]
    return "\n".join(parts).replace("\n\n\n", "\n\n").strip() + "\n"
