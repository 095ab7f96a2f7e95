"""Evaluation runs over any task family: episodes per task, their trials, and the metrics of them.

:func:`evaluate_policy` runs ``samples`` graded episodes of each task through an
:class:`~orchard.harness.episode.EpisodeRunner` (concurrent sandboxes, each episode's seed a pure
function of the run seed, the evaluation's name, the task and the sample index), with a progress
bar, and returns an :class:`Evaluation`: the trials of every task and the episodes behind them.
An episode that broke outside the policy (its sandbox or grader failed) counts as not resolved, as
SWE-bench counts an error, and is reported apart (``episodes_failed``). When every episode broke so, the
environment was down and the run measured nothing: :func:`require_environment` raises
:class:`EnvironmentDown` rather than let a stage record zeros (evaluation, and each RL step's rollouts).

:class:`RolloutConfig` is how episodes are sampled, shared by RL's rollouts and evaluation so the
two see the same policy: per-turn sampling and the harness limits.
"""

from __future__ import annotations

import asyncio
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field

from tqdm.auto import tqdm

from orchard.data.trajectory import EndReason, Trajectory
from orchard.env.client import AsyncSandboxClient
from orchard.eval.metrics import avg_at_k, mean_pass_at_k, mean_pass_hat_k, resolve_rate, task_rates
from orchard.harness.core import DEFAULT_MAX_TURNS, Harness, Limits, Policy
from orchard.harness.episode import EpisodeRunner, SandboxPool, SetupCache
from orchard.harness.task import Task
from orchard.rollout.types import SamplingParams
from orchard.seeds import episode_seed


@dataclass(frozen=True)
class RolloutConfig:
    """How a policy's episodes run: its sampling per turn and the harness limits."""

    max_new_tokens: int = 256  # per turn
    temperature: float = 1.0
    max_turns: int = DEFAULT_MAX_TURNS
    max_context: int = 8192  # prompt + completion of a turn
    episode_seconds: float = 600.0  # the agent loop's wall clock; the whole episode gets twice that
    concurrency: int = 4  # sandboxes at once

    @property
    def limits(self) -> Limits:
        return Limits(max_turns=self.max_turns, max_tokens=self.max_context, time_limit=self.episode_seconds)

    def sampling(self, seed: int, temperature: float | None = None) -> SamplingParams:
        return SamplingParams(max_tokens=self.max_new_tokens,
                              temperature=self.temperature if temperature is None else temperature, seed=seed)

    def runner(self, client: AsyncSandboxClient, harness: Harness, policy: Policy,
               setups: SetupCache | None = None, pool: SandboxPool | None = None) -> EpisodeRunner:
        """An :class:`EpisodeRunner` of these limits, concurrency and episode budget (``pool``: sandboxes
        kept between episodes of reusable families, such as browsers)."""
        return EpisodeRunner(client, harness, policy, concurrency=self.concurrency, limits=self.limits,
                             episode_seconds=2 * self.episode_seconds, setups=setups, pool=pool)


@dataclass
class Evaluation:
    """The trials of an evaluation, by task, and the episodes behind them."""

    trials: dict[str, list[bool]] = field(default_factory=dict)
    trajectories: list[Trajectory] = field(default_factory=list)

    @classmethod
    def of(cls, trajectories: Sequence[Trajectory]) -> Evaluation:
        trials: dict[str, list[bool]] = {}
        for trajectory in trajectories:
            trials.setdefault(trajectory.task_id, []).append(trajectory.outcome.resolved)
        return cls(trials, list(trajectories))

    def metrics(self) -> dict[str, float]:
        """resolve rate, avg@k, pass@k and pass^k (k: the fewest trials of a task), and counts (episodes whose
        grader found tampering among them)."""
        episodes = self.trajectories
        k = min((len(t) for t in self.trials.values()), default=0)
        out = {"resolve_rate": resolve_rate(r for t in self.trials.values() for r in t),
               "episodes": float(len(episodes)), "tasks": float(len(self.trials)),
               "tasks_solved": float(sum(any(t) for t in self.trials.values())),
               "episodes_failed": float(sum(t.end_reason is EndReason.SANDBOX_ERROR for t in episodes)),
               "episodes_tampered": float(sum(t.tampered for t in episodes)),
               "turns": statistics.fmean(t.num_actions for t in episodes) if episodes else 0.0}
        if k:
            out.update({"k": float(k), "avg_at_k": avg_at_k(self.trials), "pass_at_k": mean_pass_at_k(self.trials, k),
                        "pass_hat_k": mean_pass_hat_k(self.trials, k)})
        return out

    def task_rates(self) -> dict[str, float]:
        return task_rates(self.trials)


class EnvironmentDown(RuntimeError):
    """Every episode of a batch broke outside the policy: what ran says nothing of it."""


def require_environment(trajectories: Sequence[Trajectory], what: str) -> None:
    """Raise :class:`EnvironmentDown` when every one of ``trajectories`` (one or more) broke outside the
    policy (its sandbox, set-up, engine or grader failed), naming ``what`` ran and the first error."""
    broken = [t for t in trajectories if t.end_reason is EndReason.SANDBOX_ERROR]
    if trajectories and len(broken) == len(trajectories):
        raise EnvironmentDown(f"{what}: all {len(trajectories)} episodes broke outside the policy (the first: "
                              f"{broken[0].metadata.get('error', 'no error recorded')}); nothing was recorded, "
                              "and a rerun resumes here")


async def evaluate_policy(runner: EpisodeRunner, tasks: Sequence[Task], samples: int = 1, *, seed: int = 0,
                          name: str = "eval", progress: bool = True) -> Evaluation:
    """``samples`` graded episodes of every task (see the module docstring); :class:`EnvironmentDown` when
    every one of them broke outside the policy."""
    if samples < 1:
        raise ValueError(f"samples must be at least 1, got {samples}")
    jobs = [(task, sample) for task in tasks for sample in range(samples)]
    with tqdm(total=len(jobs), desc=name, unit="episode", disable=not progress) as bar:
        async def one(task: Task, sample: int) -> Trajectory:
            trajectory = await runner.run_one(task, episode_seed(seed, name, task.id, sample),
                                              metadata={"sample": sample})
            bar.update()
            return trajectory

        trajectories = await asyncio.gather(*(one(task, sample) for task, sample in jobs))
    require_environment(trajectories, name)
    return Evaluation.of(trajectories)
