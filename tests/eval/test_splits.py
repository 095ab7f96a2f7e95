"""The one split: by id, seeded, independent of order."""

from __future__ import annotations

import pytest

from orchard.eval.splits import held_out_ids, split_by_id


def test_a_split_is_a_seeded_fraction_of_the_ids_whatever_their_order():
    ids = [f"t{n}" for n in range(40)]
    held = held_out_ids(ids, 0.25, seed=3, purpose="p")
    assert len(held) == 10 and held <= set(ids)
    assert held_out_ids(reversed(ids), 0.25, seed=3, purpose="p") == held  # order does not matter
    assert held_out_ids(ids, 0.25, seed=4, purpose="p") != held  # the seed does
    assert held_out_ids(ids + ids, 0.25, seed=3, purpose="p") == held  # ids, not items
    assert held_out_ids(ids, 0.0, seed=3, purpose="p") == set() and len(held_out_ids(ids[:3], 0.0, 3, purpose="p", at_least_one=True)) == 1
    with pytest.raises(ValueError, match=r"in \[0, 1\)"):
        held_out_ids(ids, 1.0, seed=0, purpose="p")


def test_every_item_of_a_held_out_id_is_held_out():
    items = [(f"task{n % 5}", n) for n in range(20)]  # four trajectories of each of five tasks
    kept, held = split_by_id(items, 0.4, seed=0, key=lambda item: item[0], purpose="p")
    assert len(held) == 8 and len(kept) == 12
    assert not {task for task, _ in kept} & {task for task, _ in held}
    assert [n for _, n in kept + held] != list(range(20)) and sorted(n for _, n in kept + held) == list(range(20))
