"""The project's one split: a seeded fraction of ids held out, the rest kept, for any items.

Splits are by id (a task instance, the task of a trajectory), so that nothing of a held-out item is
seen on the other side. The split depends only on the sorted ids, the fraction and the seed: the
order items arrive in does not change it.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from typing import TypeVar

from orchard.seeds import seeded_random

T = TypeVar("T")


def held_out_ids(ids: Iterable[str], fraction: float, seed: int, *, purpose: str,
                 at_least_one: bool = False) -> set[str]:
    """A seeded ``ceil(fraction * n)`` of the distinct ``ids`` (at least one if ``at_least_one`` and
    there are any); ``purpose`` names the split, so two splits of one run draw apart (:mod:`orchard.seeds`)."""
    if not 0.0 <= fraction < 1.0:
        raise ValueError(f"a held-out fraction is in [0, 1), got {fraction}")
    ordered = sorted(set(ids))
    seeded_random(seed, f"split/{purpose}").shuffle(ordered)
    count = math.ceil(len(ordered) * fraction)
    if at_least_one and ordered:
        count = max(count, 1)
    return set(ordered[:count])


def split_by_id(items: Sequence[T], fraction: float, seed: int, key: Callable[[T], str],
                *, purpose: str, at_least_one: bool = False) -> tuple[list[T], list[T]]:
    """(kept, held out): the items whose ``key`` is among :func:`held_out_ids` go to the second list,
    each list in the items' order."""
    held = held_out_ids((key(item) for item in items), fraction, seed, purpose=purpose, at_least_one=at_least_one)
    return [i for i in items if key(i) not in held], [i for i in items if key(i) in held]
