"""The Claw task families: valid, deterministic specs whose plans pass the acceptance rule, and tests that
catch the mistakes they are written for (a plan with one mistake fails the test that names it)."""

from __future__ import annotations

import asyncio
import json
import re
from datetime import datetime, timedelta

import pytest

from orchard.tasks.claw.families import FAMILIES
from orchard.tasks.claw.families.meeting_scheduling import earliest_start
from orchard.tasks.claw.generate import PlanRunner, check_plans
from orchard.tasks.claw.spec import ClawTaskSpec, PlanStep, parse_spec

SEEDS = (0, 1, 2)


@pytest.fixture(scope="module")
def runner() -> PlanRunner:
    return PlanRunner()


def params_for(family_name: str, seed: int, held_out: bool = False) -> dict:
    """A parameter combination of the family, picked by ``seed``, from one split."""
    family = FAMILIES[family_name]
    combos = [params for params in family.PARAMS if family.HELD_OUT(params) == held_out]
    return combos[(seed * 7) % len(combos)]


def failed(runner: PlanRunner, spec: ClawTaskSpec, plan: list[PlanStep]) -> set[str]:
    """The names of the tests ``plan`` fails on ``spec``."""
    results, _ = asyncio.run(runner.graded(spec, plan))
    return {result["name"] for result in results if not result["passed"]}


def replaced(plan: list[PlanStep], tool: str, **arguments) -> list[PlanStep]:
    """``plan`` with the arguments of every call of ``tool`` updated."""
    return [PlanStep(tool=s.tool, arguments={**s.arguments, **arguments}) if s.tool == tool else s
            for s in plan]


@pytest.mark.parametrize("held_out", [False, True], ids=["train", "held_out"])
@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("name", list(FAMILIES))
def test_plans_pass_the_acceptance_rule(name, seed, held_out, runner):
    spec = FAMILIES[name].make(params_for(name, seed, held_out), seed)
    assert parse_spec(spec.model_dump(mode="json")) == spec
    assert spec.family == name and spec.environment.fault_rate == 0.0
    assert spec.reference_plan[-1].tool == "finish" and "finish" in spec.tools
    check = check_plans(spec, runner)
    assert check.reference_passed, (check.reference_call_errors, check.results["reference"])
    assert check.null_failed and check.unsafe_failed
    assert check.accepted and check.reasons == []
    # The unsafe plan is the reference plus forbidden steps, and it breaks a safety test.
    assert spec.unsafe_plan[:len(spec.reference_plan) - 1] == spec.reference_plan[:-1]
    assert any(r["kind"] == "safety" and not r["passed"] for r in check.results["unsafe"])


@pytest.mark.parametrize("name", list(FAMILIES))
def test_a_task_is_a_function_of_its_params_and_seed(name):
    family = FAMILIES[name]
    params = family.PARAMS[3]
    assert family.make(params, 5).model_dump_json() == family.make(dict(params), 5).model_dump_json()
    assert family.make(params, 5).fixtures != family.make(params, 6).fixtures
    assert family.make(params, 5).fixtures != family.make(family.PARAMS[4], 5).fixtures


@pytest.mark.parametrize("name", list(FAMILIES))
def test_each_family_holds_out_values_no_training_combination_has(name):
    family = FAMILIES[name]
    held = [params for params in family.PARAMS if family.HELD_OUT(params)]
    train = [params for params in family.PARAMS if not family.HELD_OUT(params)]
    assert held and train
    rule = family.HELD_OUT
    assert next(iter(rule.axes)) == rule.param
    assert all(rule.axis_of(params) is not None for params in held)
    for axis, values in rule.axes.items():
        assert {params[axis] for params in held if rule.axis_of(params) == axis} == set(values)
        assert not {params[axis] for params in train} & set(values)
    assert len({json.dumps(p, sort_keys=True) for p in family.PARAMS}) == len(family.PARAMS)


def test_inbox_triage_labels_only_unread_team_mail(runner):
    spec = FAMILIES["inbox_triage"].make(params_for("inbox_triage", 1), 1)
    team = spec.params["team"]
    members = {c["email"] for c in spec.fixtures["contacts"]["contacts"] if c["team"] == team}
    read_from_team = next(m for m in spec.fixtures["mail"]["messages"]
                          if m["from"] in members and m["read"] and m["folder"] == "inbox")
    label = PlanStep(tool="mail_label", arguments={"id": read_from_team["id"], "label": spec.params["label"]})
    assert failed(runner, spec, [label, *spec.reference_plan]) == {"rest_untouched"}


def test_meeting_scheduling_wants_the_earliest_common_slot(runner):
    spec = FAMILIES["meeting_scheduling"].make(params_for("meeting_scheduling", 2), 2)
    create = next(s for s in spec.reference_plan if s.tool == "calendar_create")
    start = datetime.fromisoformat(create.arguments["start"])
    assert start.hour >= 10  # the morning is always taken
    attendees = set(create.arguments["attendees"])
    nine = start.replace(hour=9, minute=0)
    early = replaced(spec.reference_plan, "calendar_create", start=nine.isoformat(),
                     end=(nine + timedelta(minutes=spec.params["duration"])).isoformat())
    assert failed(runner, spec, early) == {"meeting_time"}
    namesake = next(c["email"] for c in spec.fixtures["contacts"]["contacts"]
                    if c["email"] not in attendees and c["name"].split()[0] in spec.prompt)
    wrong_person = replaced(spec.reference_plan, "calendar_create", attendees=[*attendees, namesake])
    assert failed(runner, spec, wrong_person) == {"attendees_invited"}


def test_earliest_start_skips_gaps_too_short_and_other_peoples_meetings():
    def event(start: str, end: str, *attendees: str) -> dict:
        return {"start": f"2026-03-12T{start}:00", "end": f"2026-03-12T{end}:00",
                "attendees": list(attendees)}

    events = [event("09:00", "10:00", "a"), event("10:30", "11:00", "b", "x"), event("11:00", "12:00", "x"),
              event("11:30", "17:00", "a")]
    day = datetime(2026, 3, 12).date()
    assert earliest_start(events, {"a", "b"}, day, 30) == datetime(2026, 3, 12, 10, 0)
    assert earliest_start(events, {"a", "b"}, day, 45) is None  # 11:00-11:30 is the only other gap
    assert earliest_start(events, {"b"}, day, 90) == datetime(2026, 3, 12, 9, 0)


def test_notification_cleanup_needs_the_others_read(runner):
    spec = FAMILIES["notification_cleanup"].make(params_for("notification_cleanup", 0), 0)
    no_reads = [s for s in spec.reference_plan if s.tool != "notifications_read"]
    assert failed(runner, spec, no_reads) == {"others_read"}


def test_todo_from_mail_checks_due_dates_extra_items_and_the_reply(runner):
    spec = FAMILIES["todo_from_mail"].make(params_for("todo_from_mail", 1), 1)
    late = replaced(spec.reference_plan, "todo_create", due="2030-01-01")
    assert failed(runner, spec, late) == {"due_dates_right"}
    extra = PlanStep(tool="todo_create", arguments={"title": "Something else"})
    assert failed(runner, spec, [extra, *spec.reference_plan]) == {"only_these_items"}
    not_a_reply = replaced(spec.reference_plan, "mail_send", in_reply_to=None)
    assert failed(runner, spec, not_a_reply) == {"reply_sent"}


def test_document_edit_wants_the_last_value_of_the_thread(runner):
    spec = FAMILIES["document_edit"].make({"doc": "budget", "thread": 3, "append": False}, 4)
    write = next(s for s in spec.reference_plan if s.tool == "documents_write")
    before = next(d for d in spec.fixtures["documents"]["documents"] if d["id"] == write.arguments["id"])
    old_lines = before["content"].splitlines()
    changed = [line for line in write.arguments["content"].splitlines() if line not in old_lines]
    assert len(changed) == 1
    key, new = changed[0].split(": ", 1)
    first_proposal = next(re.search(r"It should be (.+)\.", m["body"]).group(1)
                          for m in spec.fixtures["mail"]["messages"] if "It should be" in m["body"])
    assert first_proposal != new  # the thread corrected it
    early = replaced(spec.reference_plan, "documents_write",
                     content=write.arguments["content"].replace(changed[0], f"{key}: {first_proposal}"))
    assert failed(runner, spec, early) == {"value_updated"}


def test_quick_actions_take_one_or_two_calls_and_check_what_they_ask_for(runner):
    family = FAMILIES["quick_action"]
    for action in family.ACTION_NAMES:
        spec = family.make({"action": action, "wording": 0, "cast": "invented"}, 3)
        calls = [s.tool for s in spec.reference_plan if s.tool != "finish"]
        assert 1 <= len(calls) <= 2 and spec.reference_plan[-1].tool == "finish", (action, calls)
    email = family.make({"action": "contact_email", "wording": 1, "cast": "invented"}, 5)
    wrong = replaced(email.reference_plan, "finish", answer="someone.else@example.com")
    assert failed(runner, email, wrong) == {"answer_gives_email"}
    phone = family.make({"action": "contact_phone", "wording": 0, "cast": "real"}, 5)
    spaced = phone.reference_plan[-1].arguments["answer"].replace(" ", "-")  # the digits are what count
    assert failed(runner, phone, replaced(phone.reference_plan, "finish", answer=spaced)) == set()
    todo = family.make({"action": "add_todo", "wording": 0, "cast": "invented"}, 2)
    assert failed(runner, todo, replaced(todo.reference_plan, "todo_create", due="2030-01-01")) == {"todo_added"}
    held_out_prompts = {family.PROMPTS[action][2] for action in family.ACTION_NAMES}
    trained = [p for p in family.PARAMS if not family.HELD_OUT(p)]
    assert trained and all(family.PROMPTS[p["action"]][p["wording"]] not in held_out_prompts for p in trained)


def test_quick_actions_train_on_invented_casts_and_hold_out_a_real_one():
    family = FAMILIES["quick_action"]

    def text(cast: str, seeds: range) -> str:
        """Every prompt, fixture and plan of the cast's training-wording tasks."""
        specs = [family.make({"action": action, "wording": wording, "cast": cast}, seed)
                 for action in family.ACTION_NAMES for wording in (0, 1) for seed in seeds]
        return " ".join(spec.model_dump_json(include={"prompt", "fixtures", "reference_plan"}) for spec in specs)

    invented, real = text("invented", range(12)), text("real", range(12))
    cast = family.REAL_CAST
    words = [*cast.first_names, *cast.last_names, *cast.todo_titles, *(keyword for _, keyword in cast.todo_actions),
             *(subject for subject, _ in cast.mail_topics)]
    assert not [word for word in words if re.search(rf"\b{re.escape(word)}\b", invented, re.IGNORECASE)]
    assert all(name in real for name in cast.first_names)  # the held-out tasks do use them
    # An invented cast is new in every task: two sets of seeds share (almost) no name.
    names = [{person["name"] for spec in (family.make({"action": "contact_email", "wording": 0, "cast": "invented"}, s)
                                          for s in seeds) for person in spec.fixtures["contacts"]["contacts"]}
             for seeds in (range(0, 20), range(20, 40))]
    assert len(names[0] & names[1]) <= 2 and len(names[0]) >= 100
    assert family.HELD_OUT.axis_of({"action": "add_todo", "wording": 0, "cast": "real"}) == "cast"
    assert family.HELD_OUT.axis_of({"action": "add_todo", "wording": 2, "cast": "real"}) == "wording"
    assert family.HELD_OUT.axis_of({"action": "add_todo", "wording": 1, "cast": "invented"}) is None
