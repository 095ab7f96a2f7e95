"""The one report: the main jobs' headline table, rendered from summary.json by experiments/results/run.py."""

from __future__ import annotations

import os
import subprocess
import sys

from orchard.recipes.report import results_markdown
from orchard.recipes.runner import RecipeResult
from orchard.workdir import write_json

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _result(family: str, pass_: str, measure: str, values: dict[str, float]) -> RecipeResult:
    stages = {stage: {pass_: {measure: value, "episodes": 4.0, "tasks_solved": 1.0}} for stage, value in values.items()}
    change = {"tasks_up": 3.0, "tasks_down": 1.0, "sign_test_p": 0.3125}
    return RecipeResult(family=family, config_digest="d", tasks={"sft": 2, "rl": 1, "held_out": 4}, teacher={},
                        held_out={"held_out": {"bash": stages}}, changes={"held_out": {"bash": {"rl_vs_sft": change}}},
                        rl_metrics={}, seconds={})


def test_the_headline_table_reads_each_jobs_measure_at_every_stage_and_rls_change():
    table = results_markdown({"swe": _result("swe", "greedy", "resolve_rate", {"init": 0.0, "sft": 0.25, "rl": 0.5}),
                              "claw": _result("claw", "sampled", "pass_hat_k", {"sft": 0.125, "rl": 0.375})},
                             {"swe": "resolve_rate", "claw": "pass_hat_k"})
    lines = table.splitlines()
    assert lines[0].startswith("| main job | held-out set | harness | measure | init | after SFT | after RL |")
    assert lines[2] == "| swe | held_out (4 tasks) | bash | success, greedy | 0.000 | 0.250 | 0.500 | +3 / -1 (p = 0.31) |"
    assert lines[3] == "| claw | held_out (4 tasks) | bash | pass^3, sampled | — | 0.125 | 0.375 | +3 / -1 (p = 0.31) |"


def test_the_script_writes_both_sections_and_names_the_jobs_not_run(tmp_path):
    readme, page = tmp_path / "README.md", tmp_path / "benchmarks.md"
    readme.write_text("# x\n\n<!-- results -->\nold\n<!-- /results -->\n\nafter\n")
    workdir = tmp_path / "swe"
    write_json(str(workdir / "summary.json"), _result("swe", "greedy", "resolve_rate", {"init": 0.0, "rl": 0.5}).to_dict())
    done = subprocess.run([sys.executable, "experiments/results/run.py", f"--workdirs=swe={workdir},claw={tmp_path}/none",
                           f"--readme={readme}", f"--markdown={page}"], cwd=ROOT, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    text = readme.read_text()
    assert "old" not in text and text.endswith("<!-- /results -->\n\nafter\n")
    assert "| swe | held_out (4 tasks) | bash | success, greedy | 0.000 | — | 0.500 |" in text
    assert f"Not run yet: claw ({tmp_path}/none)" in text
    assert "<!-- recipe_results -->" in page.read_text()
