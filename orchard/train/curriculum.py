"""The step-budget curriculum: the cap on an episode's steps rises from one stage to the next.

The paper's GUI RL trains with a 15-step cap until the reward saturates, then raises the cap to 30
(section 3.4). A :class:`StepBudgetCurriculum` holds the stages (each a ``max_turns`` and how long
it lasts) and is told each RL step's mean reward; it moves to the next stage when the current one
has run ``min_steps`` and the reward has **saturated** (the mean over the last ``window`` steps
gained less than ``tolerance`` on the mean of the ``window`` before), or when the stage reached its
``max_steps_in_stage``. :meth:`limits` gives the harness limits for the current stage. Its state is
a small dict (:meth:`state_dict`), saved with a checkpoint so a resumed run continues in its stage.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from orchard.harness.core import Limits


@dataclass(frozen=True)
class Stage:
    """``max_turns``: the episode cap of this stage; the stage lasts at least ``min_steps`` RL steps
    and at most ``max_steps_in_stage`` (``None``: until saturation; the last stage never ends)."""

    max_turns: int
    min_steps: int = 1
    max_steps_in_stage: int | None = None


@dataclass(frozen=True)
class CurriculumConfig:
    """A config's curriculum: no stages is none (the rollouts' own turn limit throughout)."""

    stages: tuple[Stage, ...] = ()
    window: int = 5
    tolerance: float = 0.02

    def make(self) -> StepBudgetCurriculum | None:
        return StepBudgetCurriculum(self.stages, self.window, self.tolerance) if self.stages else None


@dataclass
class StepBudgetCurriculum:
    stages: Sequence[Stage]
    window: int = 5
    tolerance: float = 0.02
    stage: int = 0
    rewards: list[float] = field(default_factory=list)  # this stage's mean reward per RL step

    def __post_init__(self) -> None:
        if not self.stages:
            raise ValueError("a curriculum needs at least one stage")
        caps = [stage.max_turns for stage in self.stages]
        if any(b <= a for a, b in itertools.pairwise(caps)):
            raise ValueError(f"each stage must allow more steps than the one before, got {caps}")
        if self.window < 1:
            raise ValueError(f"window must be at least 1, got {self.window}")

    @property
    def current(self) -> Stage:
        return self.stages[self.stage]

    def limits(self, base: Limits) -> Limits:
        """``base`` with the current stage's step cap."""
        return dataclasses.replace(base, max_turns=self.current.max_turns)

    def saturated(self) -> bool:
        """The mean reward of the last ``window`` steps gained less than ``tolerance`` on the window before."""
        if len(self.rewards) < 2 * self.window:
            return False
        last = sum(self.rewards[-self.window:]) / self.window
        before = sum(self.rewards[-2 * self.window:-self.window]) / self.window
        return last - before < self.tolerance

    def observe(self, mean_reward: float) -> bool:
        """Record an RL step's mean reward; ``True`` when this moved the curriculum to its next stage."""
        self.rewards.append(float(mean_reward))
        if self.stage == len(self.stages) - 1:
            return False
        stage, done = self.current, len(self.rewards)
        if done >= stage.min_steps and (self.saturated() or (stage.max_steps_in_stage is not None
                                                              and done >= stage.max_steps_in_stage)):
            self.stage += 1
            self.rewards = []
            return True
        return False

    def state_dict(self) -> dict[str, Any]:
        return {"stage": self.stage, "rewards": list(self.rewards)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.stage, self.rewards = int(state["stage"]), [float(r) for r in state["rewards"]]
