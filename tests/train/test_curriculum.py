"""The step-budget curriculum: the cap rises when the reward saturates, or when a stage runs out."""

from __future__ import annotations

import pytest

from orchard.harness.core import Limits
from orchard.train.curriculum import Stage, StepBudgetCurriculum


def test_the_cap_rises_when_the_reward_saturates_and_a_resumed_run_keeps_its_stage():
    curriculum = StepBudgetCurriculum([Stage(15, min_steps=4), Stage(30)], window=2, tolerance=0.05)
    base = Limits(max_turns=100, time_limit=60.0)
    assert curriculum.limits(base) == Limits(max_turns=15, time_limit=60.0)
    moved = [curriculum.observe(r) for r in (0.1, 0.3, 0.5, 0.7)]  # still climbing: no move
    assert moved == [False] * 4 and curriculum.current.max_turns == 15
    saved = curriculum.state_dict()
    assert curriculum.observe(0.72) is False  # (0.7 + 0.72) / 2 - (0.3 + 0.5) / 2 = 0.31: still gaining
    assert curriculum.observe(0.71) is False  # 0.715 - 0.6 = 0.115
    assert curriculum.observe(0.70) is True  # 0.705 - 0.71 < 0.05: saturated, the cap rises
    assert curriculum.limits(base).max_turns == 30 and curriculum.rewards == []
    assert curriculum.observe(0.9) is False  # the last stage never ends
    resumed = StepBudgetCurriculum([Stage(15, min_steps=4), Stage(30)], window=2, tolerance=0.05)
    resumed.load_state_dict(saved)
    assert resumed.current.max_turns == 15 and resumed.rewards == [0.1, 0.3, 0.5, 0.7]


def test_a_stage_ends_at_its_length_and_settings_are_checked():
    curriculum = StepBudgetCurriculum([Stage(3, max_steps_in_stage=2), Stage(6, max_steps_in_stage=1), Stage(9)],
                                      window=10)
    assert [curriculum.observe(r) for r in (0.0, 0.5, 0.9, 1.0)] == [False, True, True, False]
    assert curriculum.current.max_turns == 9
    with pytest.raises(ValueError, match="more steps"):
        StepBudgetCurriculum([Stage(30), Stage(15)])
    with pytest.raises(ValueError, match="at least one stage"):
        StepBudgetCurriculum([])
