"""Asynchronous RL: the rollouts of later steps generated while the learner trains on earlier ones.

``rl.max_staleness`` ``K`` (0: the synchronous loop, where every step's rollouts wait for the update
before them and the update waits for every rollout). With ``K > 0`` the RL loop keeps the rollouts of
steps ``s + 1 .. s + K`` in flight while the learner updates on step ``s``'s, in a thread of its own, so
the event loop keeps driving episodes (sandboxes, browsers, tool services) and the engine keeps
sampling. :class:`RolloutPipeline` launches step ``t``'s rollouts only once the update of step
``t - K - 1`` has synced its weights, so every token of them is sampled by weights at most ``K`` syncs
older than those the update of step ``t`` starts from.

**Partial rollouts.** An episode in flight when the weights change is not thrown away: its next turn
is sampled by the new weights, and its earlier turns keep the version that sampled them (each
assistant message records it: ``Message.weight_version``). The loss treats such a mixed-version row
token by token: every token's importance ratio is against the logprob the engine reported when it
sampled that token (the row's ``old_logprobs``), so the clip bounds how far the update moves from the
policy that actually sampled each token, whichever version that was. This departs from the paper,
whose RL is synchronous; it is the behaviour-logprob correction the asynchronous RL systems use,
without a separate proximal policy.

**The bound, checked.** :func:`drop_stale` measures each rollout's staleness at the update (from its
oldest token's version) and drops every group holding a rollout older than the bound, counted in the
step's metrics (``stale_dropped``); the launch rule makes that impossible for an engine that reports
versions, so a non-zero count says a server served weights the learner did not expect. Replies whose
version no one knows (a request that straddled a server's reload) are kept and counted
(``version_unknown``).
"""

from __future__ import annotations

import asyncio
import math
import statistics
from collections.abc import Awaitable, Callable, Sequence
from typing import Generic, TypeVar

from orchard.data.trajectory import Trajectory
from orchard.train.bar import GroupResult

T = TypeVar("T")


def sampled_versions(trajectory: Trajectory) -> list[int | None]:
    """The weight version of each assistant turn (None where the engine could not say)."""
    return [m.weight_version for m in trajectory.messages if m.role == "assistant"]


def staleness(trajectory: Trajectory, version: int, updates_per_sync: int = 1) -> int | None:
    """How many syncs older than ``version`` (the learner's, as the engine numbers them: its update count,
    ``updates_per_sync`` to a sync) the oldest sampled turn of ``trajectory`` is; None when a turn's version
    is unknown, 0 for a trajectory with no sampled turn."""
    versions = sampled_versions(trajectory)
    if any(v is None for v in versions):
        return None
    if not versions:
        return 0
    return max(0, math.ceil((version - min(versions)) / max(updates_per_sync, 1)))


def drop_stale(groups: Sequence[GroupResult], version: int, updates_per_sync: int,
               bound: int) -> tuple[list[GroupResult], dict[str, float]]:
    """The groups whose every rollout is at most ``bound`` syncs old at ``version``, and the step's
    staleness metrics: ``staleness_mean`` and ``staleness_max`` (over the rollouts of known version),
    ``stale_dropped`` (rollouts in the dropped groups: a group's advantages need all of it),
    ``partial_rollouts`` (rollouts sampled by more than one version) and ``version_unknown``."""
    kept, measured, dropped, unknown, partial = [], [], 0, 0, 0
    for group in groups:
        ages = [staleness(r.trajectory, version, updates_per_sync) for r in group.group]
        unknown += sum(age is None for age in ages)
        partial += sum(len(set(sampled_versions(r.trajectory))) > 1 for r in group.group)
        known = [age for age in ages if age is not None]
        measured += known
        if any(age > bound for age in known):
            dropped += len(group.group)
        else:
            kept.append(group)
    return kept, {"staleness_mean": statistics.fmean(measured) if measured else 0.0,
                  "staleness_max": float(max(measured, default=0)), "stale_dropped": float(dropped),
                  "partial_rollouts": float(partial), "version_unknown": float(unknown)}


class RolloutPipeline(Generic[T]):
    """Each step's rollouts (``collect(step)``, a coroutine) launched up to ``max_staleness`` steps ahead
    of the step the learner takes, for the steps before ``end``. Call :meth:`take` for each step in order,
    each after the previous step's update has synced; :meth:`aclose` cancels what is still in flight (the
    rollouts of steps a finished run will not take)."""

    def __init__(self, collect: Callable[[int], Awaitable[T]], max_staleness: int, end: int) -> None:
        if max_staleness < 0:
            raise ValueError(f"max_staleness must be at least 0, got {max_staleness}")
        self.collect, self.max_staleness, self.end = collect, max_staleness, end
        self._pending: dict[int, asyncio.Task[T]] = {}
        self._launched = -1  # the last step launched

    def in_flight(self) -> list[int]:
        """The steps whose rollouts are launched and not yet taken."""
        return sorted(self._pending)

    async def take(self, step: int) -> T:
        """Step ``step``'s rollouts: launch those of ``step .. step + max_staleness`` not yet launched, then
        wait for ``step``'s."""
        if self._launched < step - 1:
            self._launched = step - 1  # the first step taken (a resumed run starts part-way)
        for ahead in range(self._launched + 1, min(step + self.max_staleness, self.end - 1) + 1):
            self._pending[ahead] = asyncio.ensure_future(self.collect(ahead))
            self._launched = ahead
        if step not in self._pending:
            raise ValueError(f"step {step}'s rollouts were taken already or lie past the run's end ({self.end})")
        return await self._pending.pop(step)

    async def aclose(self) -> None:
        """Cancel the rollouts still in flight and wait for their episodes to clean up."""
        pending, self._pending = list(self._pending.values()), {}
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)

    async def __aenter__(self) -> RolloutPipeline[T]:
        return self

    async def __aexit__(self, *exc_info) -> None:
        await self.aclose()
