"""The tiny ``calc`` repository the grading and red-team tests set SWE tasks in."""

from __future__ import annotations

from pathlib import Path


def write_calc_repo(repo: Path, ops: str, tests: str) -> str:
    """``calc/ops.py`` holding ``ops`` and ``tests/test_ops.py`` holding ``tests``, under ``repo``."""
    (repo / "calc").mkdir()
    (repo / "calc" / "__init__.py").write_text("")
    (repo / "calc" / "ops.py").write_text(ops)
    (repo / "tests").mkdir()
    (repo / "tests" / "test_ops.py").write_text(tests)
    return str(repo)
