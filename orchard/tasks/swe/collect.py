"""Teacher collection: instances x harnesses x k samples, many sandboxes at once, then filters.

Each sample is one :func:`~orchard.harness.episode.run_episode`: a fresh sandbox, the instance's
repository set up in it, the harness run with the teacher, the submission graded by SWE-bench's
rules, the sandbox deleted. Unresolved trajectories get per-step values (the rule-based estimator
when the gold patch locates the bug) so credit-assignment SFT can use their rise segments.

The paper's filters drop trajectories over the token limit, with undefined tool calls, or with
unparseable actions; the harnesses report those as format errors and token-limit truncations, so a
trajectory is kept only if it had no format error and was not cut by the token budget.
"""

from __future__ import annotations

import asyncio
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from tqdm.auto import tqdm

from orchard.data.rise import annotate
from orchard.data.trajectory import Outcome, Trajectory
from orchard.env.client import AsyncSandbox, AsyncSandboxClient
from orchard.harness.core import Harness, Limits, Policy
from orchard.harness.episode import run_episode
from orchard.tasks.swe.grading import agrade
from orchard.tasks.swe.instance import SWEInstance
from orchard.tasks.swe.oracle import estimator_for
from orchard.tasks.swe.workspace import areset, asetup

TeacherFactory = Callable[[SWEInstance, str, int], Policy]  # (instance, harness name, sample index)


@dataclass
class CollectionReport:
    kept: list[Trajectory] = field(default_factory=list)
    dropped: dict[str, int] = field(default_factory=dict)  # reason -> count
    errors: list[str] = field(default_factory=list)

    def summary(self) -> dict[str, Any]:
        resolved = [t for t in self.kept if t.outcome.resolved]
        turns = [t.num_actions for t in self.kept]
        tokens = [t.metadata["context_tokens"] for t in self.kept if t.metadata.get("context_tokens")]
        chars = [sum(len(m.content) for m in t.messages) for t in self.kept]
        return {"kept": len(self.kept), "resolved": len(resolved), "unresolved": len(self.kept) - len(resolved),
                "dropped": dict(self.dropped), "errors": len(self.errors),
                "turns_mean": round(statistics.fmean(turns), 2) if turns else 0,
                "tokens_mean": round(statistics.fmean(tokens), 1) if tokens else None,  # unknown for scripted teachers
                "chars_mean": round(statistics.fmean(chars), 1) if chars else 0,
                "by_harness": {h: sum(t.harness == h for t in self.kept) for h in sorted({t.harness for t in self.kept})}}


def drop_reason(trajectory: Trajectory) -> str | None:
    """Why the paper's filters drop a trajectory, or ``None`` to keep it."""
    if trajectory.metadata.get("end_reason") == "token_limit":
        return "over_token_limit"
    if trajectory.metadata.get("format_errors", 0):
        return "format_errors"  # undefined tool calls and unparseable actions
    if trajectory.outcome.status in ("aborted", "timed_out"):
        return trajectory.outcome.status
    return None


async def collect_one(client: AsyncSandboxClient, instance: SWEInstance, harness: Harness, policy: Policy,
                      limits: Limits, seed: int) -> Trajectory:
    """One graded episode of ``instance``."""

    async def setup(sandbox: AsyncSandbox) -> None:
        await asetup(sandbox, instance)

    async def grade(sandbox: AsyncSandbox, trajectory: Trajectory) -> Outcome:
        await areset(sandbox)
        result = await agrade(sandbox, instance, trajectory.metadata.get("submission") or "")
        trajectory.metadata["grade"] = result.to_dict()
        return Outcome(reward=result.reward, resolved=result.resolved)

    trajectory = await run_episode(client, harness, policy, instance.problem_statement, task_id=instance.instance_id,
                                   limits=limits, setup=setup, grade=grade, seed=seed,
                                   metadata={"instance_id": instance.instance_id})
    if not trajectory.outcome.resolved and instance.patch:
        trajectory = annotate(trajectory, estimator_for(instance))
    return trajectory


async def collect(client: AsyncSandboxClient, instances: Sequence[SWEInstance], harnesses: Sequence[Harness],
                  teacher: TeacherFactory, samples: int, *, limits: Limits = Limits(max_steps=30),
                  concurrency: int = 4, progress: bool = True) -> CollectionReport:
    """Run every (instance, harness, sample) with at most ``concurrency`` sandboxes alive."""
    report = CollectionReport()
    gate = asyncio.Semaphore(concurrency)
    jobs = [(instance, harness, k) for instance in instances for harness in harnesses for k in range(samples)]
    bar = tqdm(total=len(jobs), desc="collect", unit="episode", disable=not progress)

    async def run(instance: SWEInstance, harness: Harness, k: int) -> None:
        async with gate:
            try:
                trajectory = await collect_one(client, instance, harness, teacher(instance, harness.name, k), limits,
                                               seed=k)
            except Exception as exc:  # one broken episode must not stop a collection of thousands
                report.errors.append(f"{instance.instance_id}/{harness.name}/{k}: {type(exc).__name__}: {exc}")
            else:
                if (reason := drop_reason(trajectory)) is None:
                    report.kept.append(trajectory)
                else:
                    report.dropped[reason] = report.dropped.get(reason, 0) + 1
            finally:
                bar.update()
                bar.set_postfix(kept=len(report.kept), resolved=sum(t.outcome.resolved for t in report.kept),
                                refresh=False)

    try:
        await asyncio.gather(*(run(*job) for job in jobs))
    finally:
        bar.close()
    report.kept.sort(key=lambda t: (t.task_id, t.harness, t.metadata.get("seed", 0)))
    return report
