"""The suite's own scheduling (tests/conftest.py): the files that share a smoke workdir are one unit of work."""

from __future__ import annotations

from tests.conftest import shared_smoke_workdir


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
