"""Claw task generation: the acceptance rule, the train/held-out split, ids, fault rates and the files."""

from __future__ import annotations

import json
import types
from collections import Counter

import pytest

from orchard.tasks.claw import generate
from orchard.tasks.claw.families import FAMILIES
from orchard.tasks.claw.generate import (
    NULL_PLAN,
    GeneratedTasks,
    check_plans,
    generate_tasks,
    read_tasks,
    write_tasks,
)
from orchard.tasks.claw.spec import TASK_ID


@pytest.fixture(scope="module")
def generated() -> GeneratedTasks:
    return generate_tasks(40)


def combo(spec) -> str:
    return json.dumps(spec.params, sort_keys=True)


@pytest.mark.slow  # the 200 tasks: about 10 s
def test_forty_per_family_make_two_hundred_accepted_tasks(generated):
    assert len(generated.train) + len(generated.held_out) >= 200
    assert generated.rejected_count == 0, generated.rejected
    assert Counter(spec.family for spec in generated.train) == {name: 32 for name in FAMILIES}
    assert Counter(spec.family for spec in generated.held_out) == {name: 8 for name in FAMILIES}
    specs = generated.train + generated.held_out
    ids = [spec.id for spec in specs]
    assert len(set(ids)) == len(ids) and all(TASK_ID.fullmatch(task_id) for task_id in ids)
    assert {spec.id for spec in generated.train if spec.family == "inbox_triage"} == {
        f"inbox_triage-{n:04d}" for n in range(32)}
    assert all(spec.environment.fault_rate == 0.0 for spec in specs)
    assert len({spec.model_dump_json(exclude={"id"}) for spec in specs}) == len(specs)  # no two alike


@pytest.mark.slow  # the 200 tasks: about 10 s
def test_held_out_tasks_use_combinations_and_values_never_seen_in_training(generated):
    assert not {combo(spec) for spec in generated.train} & {combo(spec) for spec in generated.held_out}
    for name, family in FAMILIES.items():
        rule = family.HELD_OUT
        train = [spec for spec in generated.train if spec.family == name]
        held_out = [spec for spec in generated.held_out if spec.family == name]
        assert all(rule(spec.params) for spec in held_out) and not any(rule(spec.params) for spec in train)
        for axis, values in rule.axes.items():
            assert not {spec.params[axis] for spec in train} & set(values)
        assert len({combo(spec) for spec in train}) > 1  # the training tasks cover several combinations


@pytest.mark.slow  # the 200 tasks: about 10 s
def test_tasks_round_trip_through_their_files(generated, tmp_path):
    write_tasks(generated, tmp_path)
    assert len(list((tmp_path / "train").glob("*.json"))) == len(generated.train)
    back = read_tasks(tmp_path)
    for split in ("train", "held_out"):
        written = sorted(getattr(generated, split), key=lambda spec: spec.id)
        assert getattr(back, split) == written


def test_generation_is_deterministic_and_carries_the_fault_rate():
    first = generate_tasks(2, seed=3, fault_rate=0.25)
    again = generate_tasks(2, seed=3, fault_rate=0.25)
    assert [s.model_dump_json() for s in first.train + first.held_out] == [
        s.model_dump_json() for s in again.train + again.held_out]
    assert all(spec.environment.fault_rate == 0.25 for spec in first.train + first.held_out)
    other = generate_tasks(2, seed=4)
    assert [s.fixtures for s in other.train] != [s.fixtures for s in first.train]


def test_check_plans_names_each_broken_rule():
    spec = FAMILIES["todo_from_mail"].make(FAMILIES["todo_from_mail"].PARAMS[0], 0)
    broken = spec.model_copy(update={"reference_plan": NULL_PLAN, "unsafe_plan": NULL_PLAN})
    check = check_plans(broken)
    assert not check.accepted
    assert check.reasons == ["reference_failed", "unsafe_passed"]  # the null plan still fails the same tests
    read, *rest = spec.reference_plan[1:]
    assert read.tool == "mail_read"
    wrong_read = read.model_copy(update={"arguments": {"id": "nope"}})
    plan = [spec.reference_plan[0], wrong_read, *rest]
    check = check_plans(spec.model_copy(update={"reference_plan": plan}))
    assert check.reasons == ["reference_failed"]
    assert check.reference_call_errors == ["GET /mail/messages/{id}: 404 {\"error\": \"no message 'nope'\"}"]
    without_unsafe = check_plans(spec.model_copy(update={"unsafe_plan": None}))
    assert without_unsafe.unsafe_failed is None and without_unsafe.accepted


def test_rejected_draws_are_counted_and_replaced(monkeypatch):
    real = FAMILIES["notification_cleanup"]

    def make(params, seed):
        spec = real.make(params, seed)
        return spec.model_copy(update={"unsafe_plan": spec.reference_plan}) if seed % 2 else spec

    flaky = types.SimpleNamespace(NAME=real.NAME, PARAMS=real.PARAMS, HELD_OUT=real.HELD_OUT, make=make)
    monkeypatch.setattr(generate, "FAMILIES", {real.NAME: flaky})
    tasks = generate_tasks(5)
    assert len(tasks.train) == 4 and len(tasks.held_out) == 1
    assert tasks.rejected == {"notification_cleanup: unsafe_passed": 3}  # train draws 1, 3 and 5
    assert all(spec.seed % 2 == 0 for spec in tasks.train + tasks.held_out)

    monkeypatch.setattr(generate, "FAMILIES", {real.NAME: types.SimpleNamespace(
        NAME=real.NAME, PARAMS=real.PARAMS, HELD_OUT=real.HELD_OUT,
        make=lambda params, seed: real.make(params, seed).model_copy(update={"reference_plan": NULL_PLAN}))})
    with pytest.raises(RuntimeError, match="only 0 of 4 train tasks accepted"):
        generate_tasks(5)


def test_a_generation_can_name_its_families():
    made = generate_tasks(2, families=("quick_action", "document_edit"))
    assert {spec.family for spec in made.train + made.held_out} == {"quick_action", "document_edit"}
    with pytest.raises(ValueError, match=r"no Claw families named \['mail_merge'\]"):
        generate_tasks(2, families=("mail_merge",))


def test_held_out_tasks_take_a_rules_axes_in_turn():
    made = generate_tasks(10, families=("quick_action",))  # two held out: one by wording, one by cast
    rule = FAMILIES["quick_action"].HELD_OUT
    assert sorted(rule.axis_of(spec.params) for spec in made.held_out) == ["cast", "wording"]
