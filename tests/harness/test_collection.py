"""The one teacher collection: every (task, harness, sample) once, seeded by what it is, dropped by the
family's rule, the environment's failures apart, the kept ones in job order."""

from __future__ import annotations

import asyncio

from orchard.data.trajectory import EndReason, Outcome, Trajectory
from orchard.harness.collection import Collection, collect
from orchard.seeds import episode_seed


class _Task:
    def __init__(self, id: str) -> None:
        self.id = id


class _Harness:
    def __init__(self, name: str) -> None:
        self.name = name


class _Runner:
    """Episodes that finish in reverse order of their start, so the kept order cannot come from completion."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str, int, str]] = []

    async def run_one(self, task, seed, *, harness, policy, metadata):
        self.calls.append((task.id, harness.name, seed, policy))
        await asyncio.sleep(0.001 * (10 - len(self.calls)))
        broken = task.id == "t2" and harness.name == "b" and metadata["sample"] == 0
        end = EndReason.SANDBOX_ERROR if broken else EndReason.SUBMITTED
        return Trajectory(task_id=task.id, messages=[], harness=harness.name, outcome=Outcome(resolved=task.id != "t1"),
                          metadata={**metadata, "seed": seed, "end_reason": end.value,
                                    **({"error": "sandbox died"} if broken else {})})


def test_every_job_runs_once_and_the_rule_and_the_environment_drop_apart():
    runner = _Runner()
    tasks, harnesses = [_Task("t1"), _Task("t2")], [_Harness("a"), _Harness("b")]
    seen = []

    def after(task, trajectory):
        seen.append(task.id)
        return trajectory

    collection = asyncio.run(collect(runner, tasks, harnesses, lambda task, harness, k: f"teacher-{harness.name}-{k}",
                                     2, seed=5, drop=lambda t: None if t.outcome.resolved else "not_resolved",
                                     after=after, progress=False))
    assert isinstance(collection, Collection) and len(collection.trajectories) == 8 and len(seen) == 8
    assert sorted((task, harness, policy) for task, harness, _, policy in runner.calls) == sorted(
        (t.id, h.name, f"teacher-{h.name}-{k}") for t in tasks for h in harnesses for k in range(2))
    assert {(task, harness, seed) for task, harness, seed, _ in runner.calls} == {
        (t.id, h.name, episode_seed(5, f"collect/{h.name}", t.id, k)) for t in tasks for h in harnesses for k in range(2)}
    assert collection.dropped == {"not_resolved": 4, "environment": 1}
    assert collection.errors == ["t2/b/0: sandbox died"]
    assert [(t.task_id, t.harness, t.metadata["sample"]) for t in collection.kept] == [
        ("t2", "a", 0), ("t2", "a", 1), ("t2", "b", 1)]  # (task, harness, sample) order, whatever finished first
