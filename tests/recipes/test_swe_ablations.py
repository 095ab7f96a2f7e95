"""The SWE ablations' pieces: arm names and directories, the config check, an RL run's summary and the tables.
(Each study end to end, at its small setting, is what CI runs in notebooks/credit_assignment_sft.ipynb,
notebooks/sft_scale_vs_selection.ipynb and notebooks/bar_vs_fixed_n.ipynb.)"""

from __future__ import annotations

import json
import os

import pytest

from configs.swe_ablations import get_config
from orchard.recipes.ablation_report import (
    async_table,
    check_config,
    credit_table,
    rl_table,
    scale_table,
    spread_text,
)
from orchard.recipes.swe_ablations import (
    ASYNC_MEASURES,
    arm_directory,
    arm_summary,
    async_run_summary,
    rl_run_summary,
    unresolved_arm,
)


def test_arm_names_say_what_unresolved_runs_teach_and_what_is_matched():
    assert unresolved_arm("drop") == ("drop", False)
    assert unresolved_arm("rise") == ("rise", False)
    assert unresolved_arm("whole_matched_tokens") == ("whole", True)
    for bad in ("drop_matched_tokens", "rise_matched", "half"):
        with pytest.raises(ValueError, match="unknown credit-assignment arm"):
            unresolved_arm(bad)


def test_an_arm_two_studies_share_has_one_directory():
    # the method on all the data at the main job's steps: the credit study's rise arm, the scale study's "all"
    # cell and the RL study's heavier initialisation
    credit = arm_directory("w", seed=0, steps=700, unresolved="rise", token_budget=0.0)
    scale = arm_directory("w", seed=0, steps=700, select="all", fraction=1.0)
    rl = arm_directory("w", seed=0, steps=700)
    assert credit == scale == rl == os.path.join("w", "sft", "rise_all_1_s0_700")
    assert arm_directory("w", 0, 700, token_budget=5.0) != credit
    assert arm_directory("w", 1, 700) != credit and arm_directory("w", 0, 250) != credit
    assert arm_directory("w", 0, 700, select="random", fraction=0.25).endswith("rise_random_0.25_s0_700")


def test_the_config_check_names_what_is_wrong():
    assert check_config(get_config("tiny")) == [] and check_config(get_config("small")) == []
    config = get_config("small")
    config.studies = ("credit", "rl", "sweep")
    config.credit.arms = ("drop", "partial")
    config.rl.rollout_budget = 0
    config.scale.fraction = (0.5,)  # a misspelt field
    config.credit.judge_dtype = "float33"
    config.async_study.bound = (1,)  # a misspelt field
    problems = "\n".join(check_config(config))
    assert "unknown ['sweep']" in problems
    assert "credit.arms: unknown credit-assignment arm 'partial'" in problems
    assert "rl.rollout_budget" in problems
    assert "scale: unknown field(s) fraction" in problems
    assert "credit.judge_dtype: 'float33' is not one of float32, bfloat16, float16" in problems
    assert "async_study: unknown field(s) bound" in problems


def _rl_run(tmp_path) -> str:
    rl_dir = str(tmp_path / "rl")
    os.makedirs(rl_dir)
    steps = [{"step": 1, "groups_chosen": 4, "informative_chosen": 0.5, "positive_fraction": 0.25, "rollouts": 24,
              "rollouts_total": 24, "held_out_success/held_out": 0.1},
             {"step": 2, "groups_chosen": 0, "informative_chosen": 0.0, "positive_fraction": 0.0, "rollouts": 16,
              "rollouts_total": 40},
             {"step": 3, "groups_chosen": 4, "informative_chosen": 1.0, "positive_fraction": 0.5, "rollouts": 20,
              "rollouts_total": 60}]
    with open(os.path.join(rl_dir, "metrics.jsonl"), "w") as handle:
        handle.writelines(json.dumps(s) + "\n" for s in steps)
    return rl_dir


def test_an_rl_runs_summary_counts_its_rollouts_and_updates(tmp_path):
    final = {"greedy": {"resolve_rate": 0.3}, "sampled": {"resolve_rate": 0.2}}
    summary = rl_run_summary(_rl_run(tmp_path), {"resolve_rate": 0.05}, final)
    assert (summary["steps"], summary["rollouts"], summary["updates"]) == (3, 60, 2)  # step 2 dropped every group
    assert summary["rollouts_per_update"] == 30 and summary["rollouts_per_group"] == 60 / 8
    assert summary["informative_chosen"] == 0.75 and summary["positive_fraction"] == 0.375  # over chosen groups
    assert summary["informative_per_100_rollouts"] == 10  # 2 + 4 informative groups for 60 rollouts
    assert summary["greedy_curve"] == [(0.0, 0.05), (24, 0.1), (60, 0.3)]  # SFT, mid-RL, final


def _arm(greedy: float, sampled: float, tokens: float) -> dict:
    return {"eval": {"greedy": {"resolve_rate": greedy}, "sampled": {"resolve_rate": sampled, "pass_at_k": sampled}},
            "data": {"trained_tokens": tokens, "trajectories": 10, "resolved": 5, "examples": 10}, "eval_loss": 0.5}


def test_the_tables_carry_every_seeds_spread():
    arms = {"drop": arm_summary({0: _arm(0.1, 0.2, 100), 1: _arm(0.3, 0.2, 100)}, ("greedy", "sampled")),
            "rise": arm_summary({0: _arm(0.2, 0.3, 150), 1: _arm(0.4, 0.1, 150)}, ("greedy", "sampled"))}
    assert arms["drop"]["spread"]["greedy"] == {"mean": pytest.approx(0.2), "min": 0.1, "max": 0.3, "n": 2.0}
    assert arms["rise"]["seeds"]["1"]["greedy"] == 0.4
    change = {"tasks_up": 3.0, "tasks_down": 1.0, "sign_test_p": 0.3125}
    table = credit_table({"arms": arms, "paired_vs_drop": {"rise": {"greedy": change, "sampled": change}}})
    assert "| rise | 0.300 [0.200, 0.400] |" in table and "3 / 1, 0.31" in table
    assert spread_text({"mean": 0.5, "min": 0.5, "max": 0.5, "n": 1.0}) == "0.500"
    grid = {"grid": {"random": {"0.5": arms["drop"], "1": arms["rise"]}}, "fractions": [0.5, 1.0]}
    assert "| random | 0.200 [0.100, 0.300] | 0.300 [0.200, 0.400] |" in scale_table(grid)
    spread = {"mean": 1.0, "min": 1.0, "max": 1.0, "n": 2.0}
    sampler = {"spread": {n: spread for n in ("rollouts", "informative_chosen", "informative_per_100_rollouts",
                                              "rollouts_per_update", "positive_fraction", "updates", "greedy",
                                              "sampled")},
               "change_from_sft": {"sampled": change}}
    assert rl_table({"samplers": {"bar": sampler}}).splitlines()[-1].startswith("| bar | 1.00 [1.00, 1.00] |")
    header, _, row = rl_table({"samplers": {"bar": sampler}}).splitlines()
    assert "informative groups per 100 rollouts" in header and header.count("|") == row.count("|")


def test_an_async_runs_summary_times_each_update_and_keeps_its_curves(tmp_path):
    rl_dir = str(tmp_path / "rl")
    os.makedirs(rl_dir)
    steps = [{"step": 1, "rollouts_total": 30, "reward": -0.5, "resolve_rate": 0.2, "wait_s": 20.0, "learn_s": 4.0,
              "staleness_mean": 0.0, "partial_rollouts": 0, "stale_dropped": 0},
             {"step": 2, "rollouts_total": 60, "reward": 0.0, "resolve_rate": 0.4, "wait_s": 8.0, "learn_s": 4.0,
              "staleness_mean": 0.5, "partial_rollouts": 3, "stale_dropped": 0}]
    with open(os.path.join(rl_dir, "metrics.jsonl"), "w") as handle:
        handle.writelines(json.dumps(s) + "\n" for s in steps)
    final = {"greedy": {"resolve_rate": 0.3}, "sampled": {"resolve_rate": 0.2}}
    summary = async_run_summary(rl_dir, final)
    assert (summary["steps"], summary["rollouts"], summary["wall_s"]) == (2, 60, 36.0)
    assert summary["wall_per_update_s"] == 18.0 and summary["rollouts_per_minute"] == 100.0  # 60 in 36 s
    assert summary["staleness_mean"] == 0.25 and summary["partial_rollouts"] == 3
    assert summary["reward_curve"] == [(30, -0.5), (60, 0.0)] and summary["resolve_curve"][-1] == (60, 0.4)
    spread = {"mean": 1.0, "min": 1.0, "max": 1.0, "n": 3.0}
    entry = {"spread": dict.fromkeys((*ASYNC_MEASURES, "greedy", "sampled"), spread), "speedup": 1.25,
             "change_from_synchronous": {"sampled": {"tasks_up": 2.0, "tasks_down": 1.0, "sign_test_p": 0.5}}}
    header, _, synchronous, asynchronous = async_table({"bounds": {"0": entry, "1": entry}}).splitlines()
    assert header.count("|") == synchronous.count("|") == asynchronous.count("|")
    assert asynchronous.startswith("| 1 | 1.0 [1.0, 1.0] | 1.25x |") and asynchronous.endswith("| 2 / 1, 0.50 |")
    assert synchronous.endswith("|  |")  # the synchronous runs are the baseline, not compared with themselves
