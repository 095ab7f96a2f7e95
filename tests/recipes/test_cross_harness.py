"""The cross-harness recipes' pieces: each arm's share of the teacher data, and the matrix's drops.
(The recipe end to end, at its small setting, is what CI runs in notebooks/cross_harness.ipynb.)"""

from __future__ import annotations

import pytest

from orchard.data.trajectory import Trajectory
from orchard.recipes.cross_harness import arm_trajectories, matrix_summary


def _teacher(tasks: int) -> list[Trajectory]:
    return [Trajectory(task_id=f"t{i}", harness=harness, messages=[], metadata={"sample": k})
            for i in range(tasks) for harness in ("bash", "codeact") for k in range(2)]


def test_every_arm_gets_the_same_budget_and_both_splits_the_tasks():
    teacher = _teacher(10)
    bash, codeact, both = (arm_trajectories(teacher, arm, seed=0) for arm in ("bash", "codeact", "both"))
    assert len(bash) == len(codeact) == len(both) == 20
    assert {t.harness for t in bash} == {"bash"} and {t.harness for t in codeact} == {"codeact"}
    by_harness = {h: {t.task_id for t in both if t.harness == h} for h in ("bash", "codeact")}
    assert len(by_harness["bash"]) == len(by_harness["codeact"]) == 5  # half the tasks in each harness...
    assert not by_harness["bash"] & by_harness["codeact"]  # ... and no task in both
    assert arm_trajectories(teacher, "both", seed=1) != both  # the halves are seeded
    with pytest.raises(ValueError, match="unknown arm"):
        arm_trajectories(teacher, "aider", seed=0)


def test_the_summary_reports_each_single_harness_arms_drop():
    matrix = {"bash": {"bash": {"greedy": 0.5}, "codeact": {"greedy": 0.1}, "smolagents": {"greedy": 0.0}},
              "codeact": {"bash": {"greedy": 0.2}, "codeact": {"greedy": 0.4}},
              "both": {"bash": {"greedy": 0.4}, "codeact": {"greedy": 0.35}}}
    summary = matrix_summary(matrix)
    assert summary["matrix"] is matrix
    assert summary["in_to_cross_harness_drop"] == {"greedy": {"bash": pytest.approx(0.4), "codeact": pytest.approx(0.2)}}


def test_any_pair_of_harnesses_makes_the_arms():
    teacher = [t.model_copy(update={"harness": {"bash": "claw", "codeact": "claw-shell"}[t.harness]})
               for t in _teacher(6)]
    pair = ("claw", "claw-shell")
    both = arm_trajectories(teacher, "both", seed=0, harnesses=pair)
    assert len(both) == len(arm_trajectories(teacher, "claw", seed=0, harnesses=pair)) == 12
    assert {t.harness for t in both} == set(pair)
    with pytest.raises(ValueError, match="unknown arm"):
        arm_trajectories(teacher, "bash", seed=0, harnesses=pair)
    matrix = {"claw": {"claw": {"pass_hat_k": 0.3}, "claw-shell": {"pass_hat_k": 0.1}}}
    assert matrix_summary(matrix, pair)["in_to_cross_harness_drop"] == {"pass_hat_k": {"claw": pytest.approx(0.2)}}
