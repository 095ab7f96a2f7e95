"""Asynchronous RL's bookkeeping: how far ahead rollouts are launched, and each rollout's staleness."""

from __future__ import annotations

import asyncio

import pytest

from orchard.data.trajectory import Message, Trajectory
from orchard.train.bar import GroupResult
from orchard.train.pipeline import RolloutPipeline, drop_stale, staleness
from orchard.train.rl import ScoredRollout


def _rollout(*versions: int | None) -> ScoredRollout:
    messages = [Message(role="user", content="go")]
    for version in versions:
        messages.append(Message(role="assistant", content="x", token_ids=[1], weight_version=version))
        messages.append(Message(role="tool", content="ok"))
    return ScoredRollout(Trajectory(task_id="t", messages=messages), 1.0, "completed", len(versions))


def _group(*rollouts: ScoredRollout) -> GroupResult:
    return GroupResult(group=list(rollouts), spent=len(rollouts))


def test_staleness_counts_syncs_from_the_oldest_sampled_turn():
    assert staleness(_rollout(4, 4).trajectory, 4) == 0
    assert staleness(_rollout(2, 4).trajectory, 4) == 2  # a partial rollout: its first turn is two versions old
    assert staleness(_rollout(2, 4).trajectory, 4, updates_per_sync=2) == 1  # two updates to a sync
    assert staleness(_rollout(3).trajectory, 4, updates_per_sync=2) == 1  # part of a sync is a whole one
    assert staleness(_rollout(4, None).trajectory, 4) is None
    assert staleness(_rollout().trajectory, 4) == 0


def test_groups_older_than_the_bound_are_dropped_whole_and_counted():
    fresh = _group(_rollout(5, 6), _rollout(6))
    old = _group(_rollout(6), _rollout(3, 6))  # one rollout began three syncs ago
    unknown = _group(_rollout(None), _rollout(6))
    kept, metrics = drop_stale([fresh, old, unknown], version=6, updates_per_sync=1, bound=2)
    assert kept == [fresh, unknown]
    assert metrics["stale_dropped"] == 2.0  # the old group's two rollouts: its advantages need both
    assert metrics["partial_rollouts"] == 2.0  # sampled by two versions: (5, 6) and (3, 6)
    assert metrics["version_unknown"] == 1.0
    assert metrics["staleness_max"] == 3.0 and metrics["staleness_mean"] == pytest.approx((1 + 0 + 0 + 3 + 0) / 5)
    kept, metrics = drop_stale([fresh, old], version=6, updates_per_sync=1, bound=3)
    assert kept == [fresh, old] and metrics["stale_dropped"] == 0.0


@pytest.mark.parametrize("max_staleness", [0, 1, 2])
def test_the_pipeline_launches_each_step_at_most_the_bound_ahead_of_the_learner(max_staleness):
    """Step t's rollouts start only after the update of step t - K - 1, and every step is taken once."""
    learner_step, launched_at = 0, {}

    async def collect(step: int) -> int:
        launched_at[step] = learner_step  # how many updates were done when the step's rollouts began
        await asyncio.sleep(0)
        return step

    async def run() -> list[int]:
        nonlocal learner_step
        taken = []
        async with RolloutPipeline(collect, max_staleness, end=6) as pipeline:
            for step in range(6):
                taken.append(await pipeline.take(step))
                assert pipeline.in_flight() == list(range(step + 1, min(step + max_staleness, 5) + 1))
                await asyncio.sleep(0.01)  # the update, while the launched steps' rollouts run
                learner_step += 1
        return taken

    assert asyncio.run(run()) == list(range(6))
    for step, updates in launched_at.items():
        assert updates == max(0, step - max_staleness)  # launched as soon as the bound allows, never sooner
        assert step - updates <= max_staleness  # so the update of `step` is at most K syncs newer


def test_a_resumed_pipeline_starts_at_its_first_step_and_closing_cancels_what_is_in_flight():
    started, cancelled = [], []

    async def collect(step: int) -> int:
        started.append(step)
        try:
            await asyncio.sleep(10 if step > 3 else 0)
        except asyncio.CancelledError:
            cancelled.append(step)
            raise
        return step

    async def run() -> None:
        async with RolloutPipeline(collect, 2, end=10) as pipeline:
            assert await pipeline.take(3) == 3  # a run resumed at step 3 launches 3, 4 and 5
            with pytest.raises(ValueError, match="taken already"):
                await pipeline.take(3)

    asyncio.run(run())
    assert started == [3, 4, 5] and sorted(cancelled) == [4, 5]
    with pytest.raises(ValueError, match="max_staleness"):
        RolloutPipeline(collect, -1, end=1)
