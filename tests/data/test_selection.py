"""The SFT data selectors: how many each keeps, and which."""

from __future__ import annotations

import pytest

from orchard.data.selection import select_trajectories, selection_size
from orchard.data.trajectory import Message, ToolCall, Trajectory


def _run(task: str, actions: int, sample: int, group: str) -> Trajectory:
    messages = [Message(role="user", content="fix it")]
    for step in range(actions):
        call = ToolCall(id=f"c{step}", name="bash", arguments={"command": "ls"})
        messages += [Message(role="assistant", content="", tool_calls=[call]),
                     Message(role="tool", content="x" * step, tool_call_id=f"c{step}")]
    return Trajectory(task_id=task, harness="bash", messages=messages, metadata={"sample": sample, "group": group})


# 4 groups (helpers) of 3 tasks, the first group's tasks with 4 runs each, the others' with 1 (21 runs); lengths vary
POOL = [_run(f"g{g}t{t}", actions=1 + (g + t + s) % 5, sample=s, group=f"g{g}")
        for g in range(4) for t in range(3) for s in range(4 if g == 0 else 1)]


def test_each_rule_keeps_its_fraction_in_input_order_and_is_seeded():
    for rule in ("random", "one_per_task", "diverse", "shortest"):
        for fraction in (0.25, 0.5, 1.0):
            kept = select_trajectories(POOL, rule, fraction, seed=0, group=lambda t: t.metadata["group"])
            assert len(kept) == selection_size(len(POOL), fraction) == round(fraction * 21), (rule, fraction)
            assert kept == [t for t in POOL if any(t is k for k in kept)]  # input order
    assert select_trajectories(POOL, "random", 0.5, seed=0) != select_trajectories(POOL, "random", 0.5, seed=1)
    assert select_trajectories(POOL, "all", 1.0, seed=0) == POOL
    assert selection_size(0, 0.5) == 0 and selection_size(3, 0.01) == 1


def test_one_per_task_covers_every_task_before_repeating_one():
    kept = select_trajectories(POOL, "one_per_task", 9 / 21, seed=0)  # one run of 9 of the 12 tasks
    assert len({t.task_id for t in kept}) == len(kept) == 9
    kept = select_trajectories(POOL, "one_per_task", 14 / 21, seed=0)  # every task, then 2 repeats
    assert len(kept) == 14 and len({t.task_id for t in kept}) == 12


def test_diverse_takes_every_group_in_turn():
    by_group = lambda t: t.metadata["group"]  # noqa: E731
    kept = select_trajectories(POOL, "diverse", 8 / 21, seed=3, group=by_group)
    groups = [by_group(t) for t in kept]
    assert all(groups.count(g) == 2 for g in ("g0", "g1", "g2", "g3"))  # 2 of each of the 4 helpers
    assert len({t.task_id for t in kept}) == 8  # and within a helper, tasks before repeats
    # random sampling over-draws the big group (12 of the 21 runs are g0's)
    assert max(sum(by_group(t) == "g0" for t in select_trajectories(POOL, "random", 8 / 21, seed=s))
               for s in range(5)) > 2


def test_shortest_keeps_the_fewest_actions():
    kept = select_trajectories(POOL, "shortest", 0.25, seed=0)
    assert max(t.num_actions for t in kept) <= min(t.num_actions for t in POOL if not any(t is k for k in kept))


def test_bad_settings_say_what_is_wrong():
    with pytest.raises(ValueError, match="unknown selection rule"):
        select_trajectories(POOL, "longest", 0.5, seed=0)
    with pytest.raises(ValueError, match="needs each trajectory's group"):
        select_trajectories(POOL, "diverse", 0.5, seed=0)
    with pytest.raises(ValueError, match=r"in \(0, 1\]"):
        select_trajectories(POOL, "random", 0.0, seed=0)
    with pytest.raises(ValueError, match="keeps every trajectory"):
        select_trajectories(POOL, "all", 0.5, seed=0)
