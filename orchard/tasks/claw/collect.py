"""Claw teacher collection: the project's one collection (:mod:`orchard.harness.collection`) with the Claw
teacher, only completed episodes kept.

The paper's Claw SFT set (section 3.5 of the notes) is completed trajectories from two harnesses.
Every (task, harness, sample) runs one graded episode (pooled sandboxes: a Claw sandbox is reset
between tasks); an episode is kept when every test passed
(reward +1) and it had no format error. Each dropped one is counted by why: ``not_completed`` (a test
failed), ``format_errors``, ``timed_out`` (cut by the wall clock, never graded), or ``environment``
(its sandbox or grader failed; also listed in ``errors``). A kept episode names the turns where the teacher
erred on purpose (``metadata["untaught_actions"]``, :class:`~orchard.tasks.claw.oracle.PlanPolicy`), which SFT
does not teach.
"""

from __future__ import annotations

import statistics
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from orchard.data.trajectory import EndReason, Trajectory
from orchard.harness.collection import Collection
from orchard.harness.collection import collect as collect_episodes
from orchard.harness.core import Harness
from orchard.harness.episode import EpisodeRunner
from orchard.harness.task import Task
from orchard.tasks.claw.oracle import PlanPolicy, TeacherFactory, harness_style
from orchard.tasks.claw.task import ClawTask


@dataclass
class ClawCollection(Collection):
    def summary(self) -> dict[str, Any]:
        turns = [t.num_actions for t in self.kept]
        faults = [t.metadata.get("claw", {}).get("faults", 0) for t in self.kept]
        return {"kept": len(self.kept), "dropped": dict(self.dropped), "errors": len(self.errors),
                "turns_mean": round(statistics.fmean(turns), 2) if turns else 0.0,
                "with_faults": sum(f > 0 for f in faults),
                "by_harness": dict(sorted(Counter(t.harness for t in self.kept).items())),
                "by_variant": dict(sorted(Counter(t.policy for t in self.kept).items()))}


def drop_reason(trajectory: Trajectory) -> str | None:
    """Why a teacher episode is not kept (see the module docstring), or ``None`` to keep it."""
    if trajectory.end_reason is EndReason.SANDBOX_ERROR or "grading_error" in trajectory.metadata.get("claw", {}):
        return "environment"
    if trajectory.outcome.reward is None:
        return "timed_out"
    if trajectory.metadata.get("format_errors", 0):
        return "format_errors"
    if trajectory.outcome.reward != 1.0:
        return "not_completed"
    return None


async def collect(runner: EpisodeRunner, tasks: Sequence[ClawTask], harnesses: Sequence[Harness],
                  teacher: TeacherFactory, samples: int, *, seed: int = 0, progress: bool = True) -> ClawCollection:
    """``samples`` teacher episodes of every task in every harness (the teacher speaks each one's
    style: :func:`~orchard.tasks.claw.oracle.harness_style`), the completed ones kept, in (task,
    harness, sample) order."""
    policies: dict[tuple[str, str, int], PlanPolicy] = {}

    def policy(task: Task, harness: Harness, k: int) -> PlanPolicy:
        made = policies[task.id, harness.name, k] = teacher(task.spec, harness_style(harness), k)  # type: ignore[attr-defined]
        return made

    def after(task: Task, trajectory: Trajectory) -> Trajectory:
        said = policies.pop((task.id, trajectory.harness, trajectory.metadata["sample"]))
        if said.untaught:
            trajectory.metadata["untaught_actions"] = sorted(said.untaught)
        return name_grading_error(task, trajectory)

    return await collect_episodes(runner, tasks, harnesses, policy, samples, seed=seed, drop=drop_reason, after=after,
                                  progress=progress, desc="Claw teacher", kind=ClawCollection)


def name_grading_error(task: Task, trajectory: Trajectory) -> Trajectory:
    """A grader's failure named as the episode's error, so collection lists it with the environment's."""
    if (error := trajectory.metadata.get("claw", {}).get("grading_error")) and not trajectory.metadata.get("error"):
        trajectory.metadata["error"] = error
    return trajectory
