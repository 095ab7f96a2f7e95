"""Claw teacher collection: tasks x harnesses x samples of the teacher, only completed episodes kept.

The paper's Claw SFT set (section 3.5 of the notes) is completed trajectories from two harnesses.
Every (task, harness, sample) runs one graded episode (:class:`~orchard.harness.episode.EpisodeRunner`,
pooled sandboxes: a Claw sandbox is reset between tasks); an episode is kept when every test passed
(reward +1) and it had no format error. Each dropped one is counted by why: ``not_completed`` (a test
failed), ``format_errors``, ``timed_out`` (cut by the wall clock, never graded), or ``environment``
(its sandbox or grader failed; also listed in ``errors``).
"""

from __future__ import annotations

import asyncio
import statistics
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from tqdm.auto import tqdm

from orchard.data.trajectory import EndReason, Trajectory
from orchard.harness.core import Harness
from orchard.harness.episode import EpisodeRunner
from orchard.seeds import episode_seed
from orchard.tasks.claw.oracle import TeacherFactory, harness_style
from orchard.tasks.claw.task import ClawTask


@dataclass
class ClawCollection:
    kept: list[Trajectory] = field(default_factory=list)
    dropped: Counter[str] = field(default_factory=Counter)
    errors: list[str] = field(default_factory=list)

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
    collection = ClawCollection()
    jobs = [(task, harness, k) for task in tasks for harness in harnesses for k in range(samples)]
    bar = tqdm(total=len(jobs), desc="Claw teacher", unit="episode", disable=not progress)

    async def run(task: ClawTask, harness: Harness, k: int) -> None:
        trajectory = await runner.run_one(task, episode_seed(seed, f"collect/{harness.name}", task.id, k),
                                          harness=harness, policy=teacher(task.spec, harness_style(harness), k),
                                          metadata={"sample": k})
        reason = drop_reason(trajectory)
        if reason is None:
            collection.kept.append(trajectory)
        else:
            collection.dropped[reason] += 1
            if reason == "environment":
                collection.errors.append(f"{task.id}/{harness.name}/{k}: {trajectory.metadata.get('error') or ''}"
                                         f"{trajectory.metadata.get('claw', {}).get('grading_error', '')}")
        bar.update()
        bar.set_postfix(kept=len(collection.kept), refresh=False)

    try:
        await asyncio.gather(*(run(*job) for job in jobs))
    finally:
        bar.close()
    collection.kept.sort(key=lambda t: (t.task_id, t.harness, t.metadata.get("sample", 0)))
    return collection
