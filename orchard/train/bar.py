"""Group samplers for GRPO: Balanced Adaptive Rollout (BAR) and two baselines.

BAR (section 3.3 of the paper notes) assembles each training group online. With group size ``N``,
budget ``N_max``, stride ``s`` and a window ``[rho_min, rho_max]`` of positive fractions centred on
``rho* = (rho_min + rho_max) / 2``, it generates ``s`` rollouts at a time and stops at the first
stride after which ``N`` of the pool can be chosen with a positive fraction inside the window. The
positive count is the feasible one closest to ``rho* * N`` (ties go to the smaller count). Within
each side, rollouts are taken in order of status (``completed`` before ``truncated``), then length
(shorter first). Only completed and truncated rollouts are usable. After ``N_max`` rollouts it
retries with the relaxed window ``[0, 1]``, and if even that fails (too few usable rollouts), it
takes the top-ranked of the usable ones: never an aborted or timed-out rollout, nor one whose
reward is ``None`` (the group may then be smaller than ``N``, or empty).

Baselines behind the same interface: fixed-N GRPO (take the first ``N``), and DAPO-style dynamic
filtering (a group without reward variance is dropped and the caller moves to a new prompt).
Every sampler reports the rollouts it spent, whether a fallback fired, and whether the returned
group has variance.
"""

from __future__ import annotations

import math
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Generic, Literal, Protocol, TypeVar

USABLE = {"completed": 0, "truncated": 1}


class Rollout(Protocol):
    reward: float | None
    status: str
    length: int


R = TypeVar("R", bound=Rollout)
Generate = Callable[[int], Awaitable[list[R]]]  # generate(k): k new rollouts of the prompt


def _order(rollouts: Sequence[R]) -> list[R]:
    return sorted(rollouts, key=lambda r: (USABLE.get(r.status, len(USABLE)), r.length))


def assemble_group(pool: Sequence[R], group_size: int, rho_min: float, rho_max: float) -> list[R] | None:
    """Choose ``group_size`` usable rollouts whose positive fraction lies in ``[rho_min, rho_max]``,
    with the positive count closest to the window's centre; ``None`` if no such group exists."""
    usable = [r for r in pool if r.status in USABLE and r.reward is not None]
    positives = _order([r for r in usable if r.reward > 0])
    negatives = _order([r for r in usable if r.reward <= 0])
    target = (rho_min + rho_max) / 2 * group_size
    counts = range(math.ceil(rho_min * group_size - 1e-9), math.floor(rho_max * group_size + 1e-9) + 1)
    for n_pos in sorted(counts, key=lambda n: (abs(n - target), n)):
        if n_pos <= len(positives) and group_size - n_pos <= len(negatives):
            return positives[:n_pos] + negatives[: group_size - n_pos]
    return None


def top_ranked(pool: Sequence[R], group_size: int) -> list[R]:
    """The best ``group_size`` usable rollouts of the pool (completed or truncated, with a reward):
    highest reward, then status, then length."""
    usable = [r for r in pool if r.status in USABLE and r.reward is not None]
    return sorted(usable, key=lambda r: (-r.reward, USABLE[r.status], r.length))[:group_size]


def _positives(rollouts: Sequence[Rollout]) -> int:
    return sum(r.reward is not None and r.reward > 0 for r in rollouts)


def _dropped(rollouts: Sequence[Rollout]) -> int:
    return sum(r.reward is None for r in rollouts)


def has_variance(group: Sequence[Rollout]) -> bool:
    return len({r.reward for r in group}) > 1


@dataclass
class GroupResult(Generic[R]):
    group: list[R]  # empty when the sampler dropped the prompt
    spent: int  # rollouts generated for this prompt
    fallback: Literal["none", "relaxed", "top_ranked"] = "none"
    resolved: int = 0  # positive rollouts among all ``spent``, chosen or not
    dropped: int = 0  # rollouts among ``spent`` whose reward is None (in no group)

    @property
    def informative(self) -> bool:
        return has_variance(self.group)


class GroupSampler(Protocol):
    async def sample(self, generate: Generate) -> GroupResult:
        """Spend rollouts of one prompt and return its training group (possibly empty: dropped)."""
        ...


@dataclass
class BAR:
    group_size: int = 8
    max_budget: int = 16
    stride: int = 16
    rho_min: float = 0.375
    rho_max: float = 0.625

    def __post_init__(self) -> None:
        if not 0 <= self.rho_min <= self.rho_max <= 1 or self.stride < 1 or self.max_budget < self.group_size:
            raise ValueError(f"invalid BAR settings: {self}")

    async def sample(self, generate: Generate) -> GroupResult:
        pool: list = []
        while len(pool) < self.max_budget:
            pool += await generate(min(self.stride, self.max_budget - len(pool)))
            if (group := assemble_group(pool, self.group_size, self.rho_min, self.rho_max)) is not None:
                return GroupResult(group, len(pool), resolved=_positives(pool), dropped=_dropped(pool))
        if (group := assemble_group(pool, self.group_size, 0.0, 1.0)) is not None:
            return GroupResult(group, len(pool), "relaxed", _positives(pool), _dropped(pool))
        return GroupResult(top_ranked(pool, self.group_size), len(pool), "top_ranked", _positives(pool),
                           _dropped(pool))


@dataclass
class FixedGroup:
    """Plain GRPO: ``group_size`` rollouts, whatever their rewards."""

    group_size: int = 8

    async def sample(self, generate: Generate) -> GroupResult:
        rollouts = await generate(self.group_size)
        group = [r for r in rollouts if r.reward is not None]
        return GroupResult(group, self.group_size, resolved=_positives(group), dropped=_dropped(rollouts))


@dataclass
class DynamicFilter:
    """DAPO-style dynamic sampling: a group without reward variance is dropped (returned empty) and
    the caller draws another prompt."""

    group_size: int = 8

    async def sample(self, generate: Generate) -> GroupResult:
        rollouts = await generate(self.group_size)
        group = [r for r in rollouts if r.reward is not None]
        return GroupResult(group if has_variance(group) else [], self.group_size, resolved=_positives(group),
                           dropped=_dropped(rollouts))


@dataclass(frozen=True)
class SamplerConfig:
    """A group sampler by name: ``bar`` (the paper's), ``fixed`` (GRPO) or ``dynamic`` (DAPO)."""

    name: Literal["bar", "fixed", "dynamic"] = "bar"
    group_size: int = 8
    max_budget: int = 16  # BAR only
    stride: int = 16  # BAR only
    rho_min: float = 0.375  # BAR only
    rho_max: float = 0.625  # BAR only


def make_sampler(config: SamplerConfig) -> GroupSampler:
    """The group sampler ``config`` names."""
    if config.name == "bar":
        return BAR(config.group_size, config.max_budget, config.stride, config.rho_min, config.rho_max)
    if config.name == "fixed":
        return FixedGroup(config.group_size)
    if config.name == "dynamic":
        return DynamicFilter(config.group_size)
    raise ValueError(f"unknown group sampler {config.name!r}: bar, fixed or dynamic")
