"""An evaluation run over SWE tasks in real sandboxes: trials per task, the metrics of them, seeds by task."""

from __future__ import annotations

import asyncio

from orchard.eval.runner import Evaluation, RolloutConfig, evaluate_policy
from orchard.harness.bash import BashHarness
from orchard.harness.episode import SetupCache
from orchard.tasks.swe.generate import generate_task_set
from orchard.tasks.swe.oracle import OracleTeacher
from orchard.tasks.swe.sources import resolve_source
from orchard.tasks.swe.task import swe_tasks


class Oracle:
    """One policy for every task, as an evaluated model is: the oracle teacher of the task it is shown."""

    name = "oracle"

    def __init__(self, instances, variant: str = "clean") -> None:
        self.instances, self.variant = instances, variant

    async def act(self, conversation, *, max_context=None):
        task = next(i for i in self.instances if i.problem_statement in conversation.messages[1].content)
        return await OracleTeacher(task, "bash", self.variant).act(conversation, max_context=max_context)


def test_evaluate_policy_measures_a_policy_over_tasks(orchestrator, tmp_path):
    instances, _ = generate_task_set([resolve_source("stockroom")], 2, str(tmp_path), seed=4, tests_visible=True)
    tasks = swe_tasks(instances)
    rollout = RolloutConfig(max_turns=12, max_context=100_000, concurrency=2)

    async def run(variant: str):
        async with orchestrator.async_client() as client, SetupCache(client) as setups:
            runner = rollout.runner(client, BashHarness(), Oracle(instances, variant), setups)
            return await evaluate_policy(runner, tasks, samples=2, seed=0, name="eval", progress=False)

    clean = asyncio.run(run("clean"))
    assert sorted(clean.trials) == sorted(t.id for t in tasks) and all(len(t) == 2 for t in clean.trials.values())
    metrics = clean.metrics()
    assert metrics["resolve_rate"] == 1.0 and metrics["pass_at_k"] == 1.0 and metrics["pass_hat_k"] == 1.0
    assert (metrics["episodes"], metrics["tasks"], metrics["tasks_solved"], metrics["k"]) == (4.0, 2.0, 2.0, 2.0)
    assert metrics["episodes_failed"] == 0.0 and metrics["episodes_tampered"] == 0.0 and metrics["turns"] >= 5
    seeds = {(t.task_id, t.metadata["sample"]): t.metadata["seed"] for t in clean.trajectories}
    assert len(set(seeds.values())) == 4  # a seed per (task, sample)
    failing = asyncio.run(run("fail")).metrics()
    assert failing["resolve_rate"] == 0.0 and failing["pass_at_k"] == 0.0 and failing["tasks_solved"] == 0.0


def test_an_evaluation_summarises_its_trials():
    from orchard.data.trajectory import Outcome, Trajectory

    def episode(task: str, resolved: bool) -> Trajectory:
        return Trajectory(task_id=task, messages=[], outcome=Outcome(resolved=resolved))

    evaluation = Evaluation.of([episode("a", True), episode("a", False), episode("a", False), episode("b", True),
                                episode("b", True), episode("b", True)])
    metrics = evaluation.metrics()
    assert metrics["k"] == 3.0 and metrics["resolve_rate"] == 4 / 6 and metrics["avg_at_k"] == (1 / 3 + 1) / 2
    assert metrics["pass_at_k"] == 1.0 and metrics["pass_hat_k"] == 0.5
    assert evaluation.task_rates() == {"a": 1 / 3, "b": 1.0}


def test_an_evaluation_whose_every_episode_broke_outside_the_policy_raises_instead_of_scoring_zero():
    """A sandbox backend that went down mid-study once let a stage record 0 for every held-out set; a broken
    episode among good ones still counts as a failure, as SWE-bench counts an error."""
    import pytest

    from orchard.data.trajectory import EndReason, Outcome, Trajectory
    from orchard.eval.runner import EnvironmentDown

    class Runner:
        def __init__(self, broken: set[str]) -> None:
            self.broken = broken

        async def run_one(self, task, seed, metadata):
            if task.id in self.broken:
                return Trajectory(task_id=task.id, messages=[], outcome=Outcome(reward=None, status="aborted"),
                                  metadata={**metadata, "end_reason": EndReason.SANDBOX_ERROR,
                                            "error": "BackendUnavailable: overlay: too many levels of symbolic links"})
            return Trajectory(task_id=task.id, messages=[], outcome=Outcome(resolved=True), metadata=metadata)

    class Task:
        def __init__(self, id: str) -> None:
            self.id = id

    tasks = [Task("a"), Task("b")]
    with pytest.raises(EnvironmentDown, match=r"held-out: all 4 episodes broke .*too many levels of symbolic links"):
        asyncio.run(evaluate_policy(Runner({"a", "b"}), tasks, samples=2, name="held-out", progress=False))
    metrics = asyncio.run(evaluate_policy(Runner({"a"}), tasks, samples=2, progress=False)).metrics()
    assert metrics["episodes_failed"] == 2.0 and metrics["resolve_rate"] == 0.5
