"""Renamed copies of Claw teacher episodes, so that a policy learns to copy names rather than recall them.

A family whose tasks invent their cast (:mod:`.families.quick_action`) provides ``recast(params, seed, rng)``:
a mapping from each word the task made up to a fresh one. Applied throughout an episode (the request, the
calls and the tools' answers: :func:`orchard.data.renaming.renamed_copy`), it gives the same episode about
people and projects no other row has. The copies keep their task's id, so they stay on its side of SFT's
eval split.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from orchard.data.renaming import renamed_copy
from orchard.data.trajectory import Trajectory
from orchard.seeds import seeded_random
from orchard.tasks.claw.families import FAMILIES
from orchard.tasks.claw.spec import ClawTaskSpec


def renamed_episodes(trajectories: Sequence[Trajectory], specs: Mapping[str, ClawTaskSpec], seed: int,
                     copies: int, first: int = 0) -> list[Trajectory]:
    """``copies`` renamed copies (indices ``first`` on) of every episode whose task (in ``specs``, by id) is of a
    family that invents its cast and did; episodes of other tasks have none."""
    out: list[Trajectory] = []
    for run in trajectories:
        spec = specs.get(run.task_id)
        recast = getattr(FAMILIES.get(spec.family), "recast", None) if spec is not None else None
        if recast is None:
            continue
        for copy in range(first, first + copies):
            mapping = recast(spec.params, spec.seed, seeded_random(seed, "claw-renaming", run.id, copy))
            if mapping:
                out.append(renamed_copy(run, mapping, copy))
    return out
