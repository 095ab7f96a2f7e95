"""SWE teacher collection: the project's one collection (:mod:`orchard.harness.collection`) with the SWE
teacher and filters.

Each sample is one episode of an :class:`~orchard.tasks.swe.task.SWETask`: a fresh sandbox (forked from
the task's set-up), the harness run with the teacher, the submission graded by SWE-bench's rules. Unresolved trajectories get per-step values (the rule-based estimator when the gold patch
locates the bug) so credit-assignment SFT can use their rise segments.

The paper's filters drop trajectories over the token limit, with undefined tool calls, or with
unparseable actions; the harnesses report those as format errors and token-limit truncations, so a
trajectory is kept only if it had no format error and was not cut by the token budget.

:func:`make_teacher` is the one teacher factory: an OpenAI-compatible endpoint when a URL is given,
else the oracle teacher cycling through its variants.
"""

from __future__ import annotations

import os
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from orchard.data.rise import annotate
from orchard.data.trajectory import EndReason, Trajectory
from orchard.env.client import AsyncSandboxClient
from orchard.harness.collection import Collection
from orchard.harness.collection import collect as collect_episodes
from orchard.harness.core import DEFAULT_MAX_TURNS, Harness, Limits, Policy
from orchard.harness.episode import EpisodeRunner, SetupCache
from orchard.harness.policies import OpenAIChatPolicy
from orchard.harness.task import Task
from orchard.seeds import derive_seed
from orchard.tasks.swe.instance import SWEInstance
from orchard.tasks.swe.oracle import VARIANTS, OracleTeacher, estimator_for
from orchard.tasks.swe.task import SWETask

TeacherFactory = Callable[[SWEInstance, str, int], Policy]  # (instance, harness name, sample index)
TEACHER_KEY_ENV = "ORCHARD_TEACHER_API_KEY"  # the teacher endpoint's key: read from the environment, never a config


@dataclass(frozen=True)
class CollectionConfig:
    """Teacher collection: who teaches, how many episodes a task, and their limits."""

    url: str = ""  # an OpenAI-compatible teacher (its key in $ORCHARD_TEACHER_API_KEY); empty: the oracle teacher
    model: str = "teacher"
    samples: int = 2  # episodes per task and harness
    variants: tuple[str, ...] = ("clean", "fail")  # the oracle teacher's: a task's samples take consecutive ones
    brief: bool = True  # the oracle teacher's short plan: search, read, edit, submit
    concurrency: int = 4
    max_turns: int = DEFAULT_MAX_TURNS

    def teacher(self) -> TeacherFactory:
        return make_teacher(self.url, self.model, api_key=os.environ.get(TEACHER_KEY_ENV, "EMPTY"),
                            variants=self.variants, brief=self.brief, samples=self.samples)


def make_teacher(url: str = "", model: str = "teacher", *, api_key: str = "EMPTY",
                 variants: Sequence[str] = VARIANTS, brief: bool = False, samples: int | None = None) -> TeacherFactory:
    """The teacher of each (instance, harness, sample): the model at ``url`` (any OpenAI-compatible
    endpoint) for all of them, or, without a URL, the oracle teacher: sample ``k`` of a task plays variant
    ``k``, or, when a task gets ``samples`` fewer than the variants, consecutive ones from a seeded start."""
    if url:
        policy = OpenAIChatPolicy(url, model, api_key=api_key)
        return lambda instance, harness, k: policy
    if not variants:
        raise ValueError(f"the oracle teacher needs at least one variant ({', '.join(VARIANTS)})")

    def oracle(instance: SWEInstance, harness: str, k: int) -> OracleTeacher:
        # with fewer samples a task than variants, a task's samples take consecutive variants from a seeded start,
        # so that every variant still gets its share of the tasks; otherwise sample k plays variant k
        spread = samples is not None and samples < len(variants)
        start = derive_seed(0, "oracle-variant", instance.instance_id) % len(variants) if spread else 0
        return OracleTeacher(instance, harness, variants[(start + k) % len(variants)], seed=k, brief=brief)

    return oracle


@dataclass
class CollectionReport(Collection):
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
    if trajectory.end_reason is EndReason.TOKEN_LIMIT:
        return "over_token_limit"
    if trajectory.metadata.get("format_errors", 0):
        return "format_errors"  # undefined tool calls and unparseable actions
    if trajectory.outcome.status in ("aborted", "timed_out"):
        return trajectory.outcome.status
    return None


def rule_values(task: Task, trajectory: Trajectory) -> Trajectory:
    """An unresolved episode of a task whose gold patch locates the bug, annotated with the rule-based values."""
    instance = task.instance  # type: ignore[attr-defined]
    if not trajectory.outcome.resolved and trajectory.messages and instance.patch:
        return annotate(trajectory, estimator_for(instance))
    return trajectory


async def collect(client: AsyncSandboxClient, tasks: Sequence[SWETask], harnesses: Sequence[Harness],
                  teacher: TeacherFactory, samples: int, *, limits: Limits = Limits(),
                  concurrency: int = 4, seed: int = 0, progress: bool = True,
                  setups: SetupCache | None = None) -> CollectionReport:
    """Run every (task, harness, sample) with at most ``concurrency`` sandboxes alive (``setups``:
    fork each episode from its task's set-up snapshot)."""
    runner = EpisodeRunner(client, concurrency=concurrency, limits=limits, setups=setups)
    return await collect_episodes(
        runner, tasks, harnesses, lambda task, harness, k: teacher(task.instance, harness.name, k),  # type: ignore[attr-defined]
        samples, seed=seed, drop=drop_reason, after=rule_values, progress=progress, desc="collect",
        kind=CollectionReport)
