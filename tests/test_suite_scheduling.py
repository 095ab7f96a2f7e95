"""The suite's own scheduling (tests/conftest.py): the files that share a smoke workdir are one unit of work, the
notebooks run first, and the long items have time limits with room for a slower machine."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import (
    NOTEBOOK_TIMEOUT_S,
    SLOW_TIMEOUT_S,
    pytest_collection_modifyitems,
    shared_smoke_workdir,
)


def test_files_sharing_a_smoke_workdir_are_grouped_by_its_whole_name():
    assert shared_smoke_workdir("notebooks/gui_rl_init.ipynb") == "gui_rl_init_small"
    assert shared_smoke_workdir("tests/recipes/test_gui.py") == "gui_rl_init_small"  # made once, by either
    for notebook in ("credit_assignment_sft", "bar_vs_fixed_n", "sft_scale_vs_selection"):
        assert shared_smoke_workdir(f"notebooks/{notebook}.ipynb") == "swe_ablations_small"
    # One name inside another is not a match: the Claw notebook does not share the SWE cross-harness workdir.
    assert shared_smoke_workdir("notebooks/cross_harness.ipynb") == "cross_harness_small"
    assert shared_smoke_workdir("notebooks/claw_cross_harness.ipynb") == "claw_cross_harness_small"
    assert shared_smoke_workdir("tests/recipes/test_claw.py") is None
    assert shared_smoke_workdir("tests/no_such_file.py") is None


class _Item:
    """What the collection hook reads and writes of a pytest item."""

    def __init__(self, path: str, *marks: pytest.MarkDecorator) -> None:
        self.path = Path(path)
        self.marks = {mark.name: mark.mark for mark in marks}

    def get_closest_marker(self, name: str) -> pytest.Mark | None:
        return self.marks.get(name)

    def add_marker(self, mark: pytest.MarkDecorator) -> None:
        self.marks[mark.name] = mark.mark


def test_notebooks_run_first_and_long_items_get_room_for_a_slower_machine():
    plain, slow = _Item("tests/a.py"), _Item("tests/b.py", pytest.mark.slow)
    pinned, notebook = _Item("tests/c.py", pytest.mark.slow, pytest.mark.timeout(42)), _Item("notebooks/n.ipynb")
    items = [plain, slow, pinned, notebook]
    pytest_collection_modifyitems(None, items)
    assert items == [notebook, slow, pinned, plain]
    limits = [item.marks.get("timeout") and item.marks["timeout"].args for item in items]
    assert limits == [(NOTEBOOK_TIMEOUT_S,), (SLOW_TIMEOUT_S,), (42,), None]  # the rest: pyproject's 300 s
