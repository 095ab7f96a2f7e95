"""The SWE task split: held-out helpers (every bug of a function), held-out instances, SFT and RL."""

from __future__ import annotations

import math

from orchard.eval.splits import split_by_id
from orchard.tasks.swe.generate import generate_task_set
from orchard.tasks.swe.instance import SWEInstance
from orchard.tasks.swe.sources import resolve_source
from orchard.tasks.swe.taskset import TaskSetConfig, helper_key, split_task_set


def bugs(count: int, helpers: int) -> list[SWEInstance]:
    """``count`` generated-looking bugs spread over ``helpers`` functions, each caught by its function's test."""
    return [SWEInstance(instance_id=f"opkit__bug-{n:03d}", repo="acme/opkit", base_commit="c", problem_statement="",
                        FAIL_TO_PASS=(f"tests/test_ops.py::test_f{n % helpers}",),
                        metadata={"source": "opkit", "path": "opkit/ops.py", "function": f"f{n % helpers}"})
            for n in range(count)]


def ids(instances: list[SWEInstance]) -> set[str]:
    return {i.instance_id for i in instances}


def test_held_out_helpers_take_every_bug_of_their_function_and_no_instance_is_in_two_sets():
    instances = bugs(60, helpers=16)
    config = TaskSetConfig(held_out_helper_fraction=0.25, held_out_fraction=0.2, rl_fraction=0.25)
    split = split_task_set(instances, config, seed=3)
    train = split.sft + split.rl
    held_helpers = {helper_key(i) for i in split.held_out_helpers}
    assert len(held_helpers) == 4  # ceil(16 x 0.25) functions, with all of their bugs
    assert not held_helpers & {helper_key(i) for i in train}  # never seen broken in training
    assert not held_helpers & {helper_key(i) for i in split.held_out}
    assert ids(split.held_out_helpers) == {i.instance_id for i in instances if helper_key(i) in held_helpers}
    rest = len(instances) - len(split.held_out_helpers)  # the by-instance split is drawn from the others
    assert len(split.held_out) == math.ceil(rest * 0.2)
    assert len(split.rl) == math.ceil((rest - len(split.held_out)) * 0.25)
    sets = [ids(split.sft), ids(split.rl), ids(split.held_out), ids(split.held_out_helpers)]
    assert sum(map(len, sets)) == len(instances) and set().union(*sets) == ids(instances)
    # by-instance held-out bugs share their function with a training bug here: the split measures something else
    assert {helper_key(i) for i in split.held_out} <= {helper_key(i) for i in train}
    assert split.unseen == frozenset()  # computed against the training set, as before


def test_the_split_is_seeded_and_the_order_of_the_instances_changes_nothing():
    instances = bugs(60, helpers=16)
    config = TaskSetConfig(held_out_helper_fraction=0.25)
    split = split_task_set(instances, config, seed=3)
    again = split_task_set(list(reversed(instances)), config, seed=3)
    for name in ("sft", "rl", "held_out", "held_out_helpers"):
        assert getattr(again, name) == list(reversed(getattr(split, name))), name
    others = [split_task_set(instances, config, seed=s).held_out_helpers for s in range(4, 8)]
    assert any(ids(other) != ids(split.held_out_helpers) for other in others)


def test_no_held_out_helpers_leave_the_by_instance_split_as_it_was():
    instances = bugs(40, helpers=13)
    split = split_task_set(instances, TaskSetConfig(held_out_helper_fraction=0.0, held_out_fraction=0.25), seed=1)
    assert split.held_out_helpers == []
    assert split.held_out == split_by_id(instances, 0.25, 1, lambda i: i.instance_id, purpose="held-out")[1]


def test_an_instance_without_its_function_is_keyed_by_its_failing_test():
    loaded = SWEInstance(instance_id="acme__widgets-1", repo="acme/widgets", base_commit="c", problem_statement="",
                         FAIL_TO_PASS=("tests/test_a.py::test_x", "tests/test_a.py::test_y"))
    assert helper_key(loaded) == "tests/test_a.py::test_x"
    assert helper_key(bugs(1, helpers=1)[0]) == "opkit:opkit/ops.py:f0"


def test_generated_bugs_are_keyed_by_the_function_they_break(tmp_path):
    instances, _ = generate_task_set([resolve_source("opkit")], 12, str(tmp_path), seed=0, tests_visible=True)
    for instance in instances:
        function = instance.metadata["function"]
        assert helper_key(instance) == f"opkit:opkit/ops.py:{function}"
        assert instance.FAIL_TO_PASS[0].endswith(f"::test_{function}")  # opkit: one test a helper
    split = split_task_set(instances, TaskSetConfig(held_out_helper_fraction=0.3, held_out_fraction=0.2), seed=0)
    assert split.held_out_helpers
    train = {helper_key(i) for i in split.sft + split.rl}
    assert not {helper_key(i) for i in split.held_out_helpers} & train
