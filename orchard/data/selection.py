"""Which teacher trajectories an SFT run trains on: a fraction of them, chosen by a rule.

The paper (section 5.2) finds that SFT data scale matters more than the selection strategy; its
ablation trains on 512 to 2048 trajectories under several selectors. These are the rules, each
taking ``round(fraction * n)`` trajectories (at least one when there are any):

* ``all``: every trajectory (``fraction`` must be 1);
* ``random``: a seeded sample;
* ``one_per_task``: as many tasks covered as possible: a seeded pass over the tasks taking one
  trajectory of each, then a second pass, and so on;
* ``diverse``: the same round-robin over groups (the SWE recipe's: the helper a bug is in; the
  repository for real task sets), tasks within a group covered before any is repeated;
* ``shortest``: the fewest actions first (ties: the least message text), as a cheap proxy for the
  cleanest runs.

Every rule returns the trajectories in their input order, so the only change between rules is
which ones are kept. Seeds come from the caller (:func:`orchard.seeds.derive_seed`).
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from typing import Literal, get_args

from orchard.data.trajectory import Trajectory
from orchard.seeds import seeded_random

Selector = Literal["all", "random", "one_per_task", "diverse", "shortest"]
SELECTORS: tuple[str, ...] = get_args(Selector)


def selection_size(total: int, fraction: float) -> int:
    """How many of ``total`` a ``fraction`` keeps: ``round(fraction * total)``, at least one of any."""
    if not 0.0 < fraction <= 1.0:
        raise ValueError(f"a selection fraction is in (0, 1], got {fraction}")
    return min(total, max(1, round(fraction * total))) if total else 0


def _round_robin(trajectories: Sequence[Trajectory], group: Callable[[Trajectory], str], count: int,
                 rng: random.Random) -> list[int]:
    """Indices of ``count`` trajectories taken one per group in turn (groups in a seeded order), and
    within a group one per task before any task's second."""
    groups: dict[str, dict[str, list[int]]] = {}
    for index, trajectory in enumerate(trajectories):
        groups.setdefault(group(trajectory), {}).setdefault(trajectory.task_id, []).append(index)
    queues = {}
    for name in sorted(groups):
        tasks = [rng.sample(indices, len(indices)) for _, indices in sorted(groups[name].items())]
        rng.shuffle(tasks)
        # one of each task, then a second of each, ...: the group's trajectories in the order it gives them
        queues[name] = [task[depth] for depth in range(max(map(len, tasks))) for task in tasks if depth < len(task)]
    order = sorted(queues)
    rng.shuffle(order)
    chosen: list[int] = []
    while len(chosen) < count:
        for name in order:
            if queues[name] and len(chosen) < count:
                chosen.append(queues[name].pop(0))
    return chosen


def select_trajectories(trajectories: Sequence[Trajectory], rule: Selector, fraction: float, seed: int,
                        group: Callable[[Trajectory], str] | None = None) -> list[Trajectory]:
    """The trajectories ``rule`` keeps of ``trajectories`` at ``fraction`` (see the module docstring),
    in their input order. ``group`` names a trajectory's group for ``diverse`` (required there)."""
    if rule not in SELECTORS:
        raise ValueError(f"unknown selection rule {rule!r}: one of {SELECTORS}")
    if rule == "all":
        if fraction != 1.0:
            raise ValueError(f"rule 'all' keeps every trajectory; choose another rule for fraction {fraction}")
        return list(trajectories)
    count = selection_size(len(trajectories), fraction)
    rng = seeded_random(seed, "select", rule)
    if rule == "random":
        chosen = rng.sample(range(len(trajectories)), count)
    elif rule == "shortest":
        chosen = sorted(range(len(trajectories)), key=lambda i: (
            trajectories[i].num_actions, sum(len(m.content or "") for m in trajectories[i].messages), i))[:count]
    elif rule == "one_per_task":
        chosen = _round_robin(trajectories, lambda t: "", count, rng)
    else:
        if group is None:
            raise ValueError("rule 'diverse' needs each trajectory's group (a helper, a repository)")
        chosen = _round_robin(trajectories, group, count, rng)
    keep = set(chosen)
    return [t for i, t in enumerate(trajectories) if i in keep]
