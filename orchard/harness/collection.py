"""Teacher collection for any task family: tasks x harnesses x samples of a teacher, many sandboxes at once.

Every (task, harness, sample) runs one graded episode through an
:class:`~orchard.harness.episode.EpisodeRunner`, with the teacher the factory names for it and the seed
:func:`~orchard.seeds.episode_seed` of (run seed, ``collect/<harness>``, task, sample). An episode whose
sandbox or grader failed is dropped as ``environment`` and listed in ``errors``; the family's ``drop`` rule
says why any other episode is not kept (the paper's filters: over the token limit, format errors, not
completed...). ``after`` post-processes each graded episode before the rule sees it (rule-based values for
credit assignment, an LLM judge's verdict). The kept episodes come back in (task, harness, sample) order.

A family says only which teacher, which harnesses and which rules: :mod:`orchard.tasks.swe.collect`,
:mod:`orchard.tasks.gui.collect`, :mod:`orchard.tasks.claw.collect`.
"""

from __future__ import annotations

import asyncio
import inspect
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import TypeVar

from tqdm.auto import tqdm

from orchard.data.trajectory import EndReason, Trajectory
from orchard.harness.core import Harness, Policy
from orchard.harness.episode import EpisodeRunner
from orchard.harness.task import Task
from orchard.seeds import episode_seed

TeacherFactory = Callable[[Task, Harness, int], Policy]  # (task, harness, sample index) -> the teacher
DropRule = Callable[[Trajectory], str | None]  # why an episode is not kept, or None to keep it
AfterEpisode = Callable[[Task, Trajectory], Trajectory | Awaitable[Trajectory]]


@dataclass
class Collection:  # a family subclasses it for its own summary
    """Every graded teacher episode, the kept ones, why the others were dropped, and the environment's errors."""

    trajectories: list[Trajectory] = field(default_factory=list)
    kept: list[Trajectory] = field(default_factory=list)
    dropped: Counter[str] = field(default_factory=Counter)
    errors: list[str] = field(default_factory=list)


C = TypeVar("C", bound=Collection)


def keep_all(trajectory: Trajectory) -> str | None:
    """The rule that keeps every episode the environment graded."""
    return None


async def collect(runner: EpisodeRunner, tasks: Sequence[Task], harnesses: Sequence[Harness],
                  teacher: TeacherFactory, samples: int, *, seed: int = 0, drop: DropRule = keep_all,
                  after: AfterEpisode | None = None, progress: bool = True, desc: str = "teacher",
                  kind: type[C] = Collection) -> C:  # type: ignore[assignment]
    """``samples`` teacher episodes of every task in every harness (see the module docstring), into a ``kind``."""
    collection = kind()
    jobs = [(task, harness, k) for task in tasks for harness in harnesses for k in range(samples)]
    bar = tqdm(total=len(jobs), desc=desc, unit="episode", disable=not progress)

    async def run(task: Task, harness: Harness, k: int) -> Trajectory:
        trajectory = await runner.run_one(task, episode_seed(seed, f"collect/{harness.name}", task.id, k),
                                          harness=harness, policy=teacher(task, harness, k), metadata={"sample": k})
        if after is not None:
            made = after(task, trajectory)
            trajectory = await made if inspect.isawaitable(made) else made
        reason = "environment" if trajectory.end_reason is EndReason.SANDBOX_ERROR else drop(trajectory)
        if reason is None:
            collection.kept.append(trajectory)
        else:
            collection.dropped[reason] += 1
            if reason == "environment":
                collection.errors.append(f"{task.id}/{harness.name}/{k}: {trajectory.metadata.get('error') or ''}")
        bar.update()
        bar.set_postfix(kept=len(collection.kept), refresh=False)
        return trajectory

    try:
        collection.trajectories = list(await asyncio.gather(*(run(*job) for job in jobs)))
    finally:
        bar.close()
    order = {id(t): i for i, t in enumerate(collection.trajectories)}
    collection.kept.sort(key=lambda t: order[id(t)])
    return collection
