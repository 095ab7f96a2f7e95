"""Problem statements come from the failing tests and never quote the buggy code."""

from __future__ import annotations

import random

import pytest

from orchard.tasks.swe.statement import problem_statement, source_of_test
from orchard.tasks.swe.testlog import TestResult

TESTS = '''import pytest


class TestWidgets:
    @pytest.mark.parametrize("n", [1, 2])
    def test_count(self, n):
        assert n > 0


def test_total():
    assert 1 + 1 == 2
'''


def test_test_source_finds_methods_with_decorators_and_params(tmp_path):
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test_w.py").write_text(TESTS)
    method = source_of_test(str(tmp_path), "tests/test_w.py::TestWidgets::test_count[2]")
    assert method.startswith('@pytest.mark.parametrize("n", [1, 2])\ndef test_count(self, n):')
    assert source_of_test(str(tmp_path), "tests/test_w.py::test_total") == "def test_total():\n    assert 1 + 1 == 2"
    assert source_of_test(str(tmp_path), "tests/test_w.py::test_absent") is None
    assert source_of_test(str(tmp_path), "tests/missing.py::test_x") is None


def test_statement_lists_the_failures_and_drops_lines_quoting_the_code():
    failing = {f"tests/test_w.py::test_{i}": TestResult("failed", f"assert 3 == 4\n    return total - extra  # {i}")
               for i in range(10)}
    text = problem_statement("orchard/widgets", failing, {"tests/test_w.py::test_0": "def test_0():\n    ..."},
                             random.Random(0), forbidden=["return total - extra", "return total + extra"],
                             tests_visible=False)
    assert "`tests/test_w.py::test_7`" in text and "and 2 more" in text
    assert "assert 3 == 4" in text and "def test_0():" in text
    assert "total - extra" not in text and "not in the checkout" in text
    assert text != problem_statement("orchard/widgets", failing, {}, random.Random(1))  # phrasings vary
    with pytest.raises(ValueError, match="at least one failing test"):
        problem_statement("orchard/widgets", {}, {}, random.Random(0))
