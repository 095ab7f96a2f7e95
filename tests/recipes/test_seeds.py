"""The seeds study: spreads over seeds, per-seed and pooled paired changes in both passes, its table and plot,
and its script's config check."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from ml_collections import ConfigDict

from orchard.data.trajectory import Outcome, Trajectory, save_trajectories
from orchard.recipes.runner import RecipeResult, eval_directory
from orchard.recipes.seeds import (
    plot_seeds,
    run_seeds,
    seed_workdir,
    seeds_markdown,
    seeds_summary,
    seeds_table,
    summarise_seeds,
    with_seed,
)
from orchard.recipes.stages import episodes_path
from orchard.recipes.swe import SWE
from orchard.workdir import write_json

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _evaluation(workdir: str, stage: str, pass_: str, outcomes: dict[str, list[bool]]) -> dict[str, float]:
    """Episodes of one evaluation folder, and the metrics a main job would report of them."""
    save_trajectories(episodes_path(eval_directory(workdir, "combo", "bash", stage, pass_)),
                      [Trajectory(task_id=task, messages=[], outcome=Outcome(resolved=r))
                       for task, runs in outcomes.items() for r in runs])
    runs = [r for rs in outcomes.values() for r in rs]
    return {"resolve_rate": sum(runs) / len(runs), "episodes": float(len(runs))}


def _seed_run(workdir: str, greedy: dict[str, tuple[bool, bool, bool]], sampled: dict[str, tuple[list, list]]
              ) -> RecipeResult:
    """One seed's result: greedy at init, SFT and RL (one episode a task each), sampled after SFT and RL."""
    stages: dict = {}
    for index, stage in enumerate(("init", "sft", "rl")):
        stages[stage] = {"greedy": _evaluation(workdir, stage, "greedy", {t: [r[index]] for t, r in greedy.items()})}
    for index, stage in enumerate(("sft", "rl")):
        stages[stage]["sampled"] = _evaluation(workdir, stage, "sampled", {t: r[index] for t, r in sampled.items()})
    return RecipeResult(family="swe", config_digest="", tasks={}, teacher={}, held_out={"combo": {"bash": stages}},
                        changes={}, rl_metrics={}, seconds={})


def test_the_summary_spreads_each_rate_and_pools_each_change_over_seeds(tmp_path):
    workdirs = {seed: seed_workdir(str(tmp_path), seed) for seed in (0, 1, 2)}
    # greedy, per task (init, sft, rl); sampled, per task (sft episodes, rl episodes)
    results = {
        0: _seed_run(workdirs[0], {"a": (False, True, True), "b": (False, False, True), "c": (False, True, False)},
                     {"a": ([True, False], [True, True]), "b": ([False, False], [False, True])}),
        1: _seed_run(workdirs[1], {"d": (False, True, True), "e": (False, False, True)},
                     {"d": ([False, False], [True, False]), "e": ([True, True], [True, True])}),
        2: _seed_run(workdirs[2], {"f": (False, False, False), "g": (False, True, True)},
                     {"f": ([False, False], [False, False]), "g": ([True, False], [True, True])}),
    }
    summary = seeds_summary(results, workdirs)
    assert summary["seeds"] == [0, 1, 2]
    sft_greedy = summary["rates"]["combo"]["bash"]["sft"]["greedy"]
    assert sft_greedy["seeds"] == {"0": 2 / 3, "1": 0.5, "2": 0.5}
    assert sft_greedy["spread"] == pytest.approx({"mean": 5 / 9, "min": 0.5, "max": 2 / 3, "n": 3.0})

    greedy = summary["changes"]["combo"]["bash"]["greedy"]
    assert set(greedy) == {"sft_vs_init", "rl_vs_sft", "rl_vs_init"}
    # RL against SFT, greedy: seed 0 raised b and lowered c, seed 1 raised e, seed 2 changed nothing
    assert greedy["rl_vs_sft"]["seeds"]["0"] == {"tasks_up": 1.0, "tasks_down": 1.0, "sign_test_p": 0.75}
    assert greedy["rl_vs_sft"]["pooled"] == {"tasks_up": 2.0, "tasks_down": 1.0, "sign_test_p": 0.5}
    # SFT against init: 2 + 1 + 1 tasks up, none down: p = 1 / 2**4
    assert greedy["sft_vs_init"]["pooled"] == {"tasks_up": 4.0, "tasks_down": 0.0, "sign_test_p": 1 / 16}
    # sampled: only SFT and RL were sampled, at every seed; a, b, d, g rose, nothing fell
    sampled = summary["changes"]["combo"]["bash"]["sampled"]
    assert set(sampled) == {"rl_vs_sft"}
    assert sampled["rl_vs_sft"]["pooled"] == {"tasks_up": 4.0, "tasks_down": 0.0, "sign_test_p": 1 / 16}

    rows = list(zip(*(column._cells for column in seeds_table(summary).columns), strict=True))
    assert ("combo", "bash", "after SFT", "greedy", "0.556 [0.500, 0.667]", "0.667", "0.500", "0.500") in rows
    assert ("combo", "bash", "rl vs sft", "greedy", "pooled +2 / -1, p = 0.5", "+1 / -1", "+1 / -0", "+0 / -0") in rows
    assert os.path.getsize(plot_seeds(summary, str(tmp_path / "seeds.png"))) > 0

    markdown = seeds_markdown(summary, "python experiments/swe_seeds/run.py")
    assert ("| combo | bash | greedy | 0.000 [0.000, 0.000] | 0.556 [0.500, 0.667] | 0.722 [0.500, 1.000] | "
            "+4 / -0 (p = 0.062) | +2 / -1 (p = 0.5) |") in markdown

    # Seeds already run are summarised from their files, with nothing run again.
    for seed, result in results.items():
        write_json(os.path.join(workdirs[seed], "summary.json"), result.to_dict())
    assert summarise_seeds(SWE, str(tmp_path), [0, 1, 2]) == summary
    with pytest.raises(FileNotFoundError, match=r"seeds \[3\] have no finished run"):
        summarise_seeds(SWE, str(tmp_path), [0, 3])

    # A stage one seed did not evaluate is not paired for any seed.
    del results[2].held_out["combo"]["bash"]["init"]
    assert set(seeds_summary(results, workdirs)["changes"]["combo"]["bash"]["greedy"]) == {"rl_vs_sft"}


def test_each_seed_runs_with_its_own_seed_and_repeated_seeds_are_refused():
    config = ConfigDict({"seed": 0, "rl": {"seed": 5}})
    assert with_seed(config, 3).seed == 3 and config.seed == 0
    with pytest.raises(ValueError, match="distinct seeds"):
        run_seeds(None, config, "/nonexistent", [1, 1])


def test_the_script_checks_the_main_jobs_config_and_launches_nothing_on_a_dry_run(tmp_path):
    done = subprocess.run([sys.executable, "experiments/swe_seeds/run.py", "--config=configs/swe_bar.py:skills",
                           "--seeds=0,1,2", f"--workdir={tmp_path}", "--dry-run"],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "config OK: nothing launched (dry run)" in done.stdout
    assert not os.listdir(tmp_path)
