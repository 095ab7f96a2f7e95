"""The oracle teacher's plans: each variant's steps, and a search that reads the failing test's traceback."""

from __future__ import annotations

import asyncio
import os
import re
from dataclasses import replace

import pytest

from orchard.data.trajectory import Message
from orchard.harness.core import Conversation
from orchard.tasks.swe.candidates import listing_line, repair_command
from orchard.tasks.swe.collect import make_teacher
from orchard.tasks.swe.diffs import parse_patch
from orchard.tasks.swe.oracle import VARIANTS, OracleTeacher, _traceback_function, buggy_line
from orchard.tasks.swe.skills import ProceduralConfig
from orchard.tasks.swe.taskset import TaskSetConfig, make_task_set

ASSERTION = """    def test_grade_acorn():
>       assert grade_acorn(9, -1) == 9
E       assert -4 == 9
E        +  where -4 = grade_acorn(9, -1)

tests/test_rivers.py:5: AssertionError
"""
RAISED = """    def test_fold():
>       assert fold_reed([]) == 3
tests/test_reeds.py:9: in test_fold
    assert fold_reed([]) == 3
reedkit/reeds.py:14: in fold_reed
    return pack_moss(xs)[0]
reedkit/reeds.py:22: in pack_moss
    return xs[-1] * 2
E   IndexError: list index out of range
"""


def test_the_traceback_names_the_function_to_search_for():
    assert _traceback_function(ASSERTION) == "grade_acorn"
    assert _traceback_function(RAISED) == "pack_moss"  # the deepest frame in the code, not the test
    assert _traceback_function("E   AssertionError: lists differ\n") is None
    assert _traceback_function(ASSERTION.replace("grade_acorn(9", "Ops.grade_acorn(9")) == "grade_acorn"


@pytest.fixture(scope="module")
def instance(tmp_path_factory):
    config = TaskSetConfig(sources=("procedural",), kinds=("swap_operator",),
                           procedural=ProceduralConfig(repos=1, helpers=6, bugs_per_repo=1, held_out_repos=0))
    return make_task_set(config, str(tmp_path_factory.mktemp("oracle")), seed=0)[0]


def _tools(teacher: OracleTeacher) -> list[str]:
    return [step.tool if step.tool != "bash" else step.arguments["command"].split()[0] for step in teacher.plan]


def test_each_variant_plays_its_plan(instance):
    plans = {variant: _tools(OracleTeacher(instance, "bash", variant)) for variant in VARIANTS}
    assert plans["clean"] == ["python", "search", "view", "sed", "python", "finish"]
    assert plans["recover"] == ["python", "search", "view", "sed", "python", "git", "sed", "python", "finish"]
    assert plans["fail"] == ["python", "search", "view", "sed", "python", "finish"]
    assert plans["unverified"] == ["python", "search", "view", "sed", "finish"]  # submits without a re-check
    assert plans["search"] == ["python", "search", "view", "try", "python", "close"]  # tries what it read
    assert plans["wander"][-4:] == plans["clean"][-4:] and len(plans["wander"]) > len(plans["clean"])
    recover = OracleTeacher(instance, "bash", "recover")
    wrong, fix = recover.plan[3], recover.plan[6]
    assert "# checked" in wrong.arguments["command"] and "# checked" not in fix.arguments["command"]
    # the fix's thought quotes the line as `nl -ba` showed it, then says what it should be
    assert re.match(r"The bug is in `def \w+`, on this line of \S+:\n {4}[ \d]\d\t.+\nIt should be `.+`\. Fixing it\.$",
                    fix.thought), fix.thought
    assert OracleTeacher(instance, "bash", "unverified").name == "oracle-unverified"
    with pytest.raises(ValueError, match="brief plan"):
        OracleTeacher(instance, "bash", "recover", brief=True)
    with pytest.raises(ValueError, match="brief plan"):
        OracleTeacher(instance, "bash", "search", brief=True)
    with pytest.raises(ValueError, match="unknown oracle variant"):
        OracleTeacher(instance, "bash", "lucky")


def test_the_search_follows_the_traceback_it_was_shown(instance):
    teacher = OracleTeacher(instance, "bash", "clean")
    conversation = Conversation(messages=[Message(role="system", content="s"), Message(role="user", content="fix it")])
    reproduce = asyncio.run(teacher.act(conversation))
    assert "pytest" in reproduce.message.content
    conversation.messages += [reproduce.message, Message(role="user", content=RAISED)]
    search = asyncio.run(teacher.act(conversation))
    assert "The traceback points at `pack_moss`" in search.message.content
    assert "grep -rn 'def pack_moss'" in search.message.content
    # the brief plan searches first: the task's text (which quotes a traceback too) is not an observation
    brief = OracleTeacher(instance, "bash", "clean", brief=True)
    first = asyncio.run(brief.act(Conversation(messages=[Message(role="system", content="s"),
                                                         Message(role="user", content=RAISED)])))
    assert "Let me find the code the failing tests exercise" in first.message.content


def test_with_fewer_samples_than_variants_every_variant_gets_tasks(instance):
    assert [make_teacher(variants=VARIANTS)(instance, "bash", k).variant for k in range(len(VARIANTS))] == list(VARIANTS)
    teacher = make_teacher(variants=VARIANTS, samples=2)
    plays = [[teacher(replace(instance, instance_id=f"task-{n}"), "bash", k).variant for k in range(2)]
             for n in range(40)]
    assert {variant for pair in plays for variant in pair} == set(VARIANTS)
    for first, second in plays:  # a task's samples play consecutive variants
        assert VARIANTS.index(second) == (VARIANTS.index(first) + 1) % len(VARIANTS)
    assert plays == [[teacher(replace(instance, instance_id=f"task-{n}"), "bash", k).variant for k in range(2)]
                     for n in range(40)]  # seeded


def test_the_search_variant_runs_the_repair_on_the_function_it_read(instance):
    teacher = OracleTeacher(instance, "bash", "search")
    [hunk, *_] = parse_patch(instance.patch)
    number, _ = buggy_line(hunk)
    with open(os.path.join(instance.repo_path, hunk.path)) as handle:
        lines = handle.read().split("\n")
    def_line = max(n for n, line in enumerate(lines[:number], start=1) if line.startswith("def "))
    listing = "\n".join(listing_line(n, line) for n, line in enumerate(lines, start=1))

    def act_after(observation: str):
        messages = [Message(role="system", content="s"), Message(role="user", content="fix it")]
        for reply in ("1 failed", "found it", observation):  # the plan's fourth step reads the third observation
            messages += [Message(role="assistant", content="..."), Message(role="user", content=reply)]
        return asyncio.run(teacher.act(Conversation(messages=messages))).message.content

    action = act_after(listing)
    assert "try each one-token change" in action and repair_command(hunk.path, def_line) in action
    assert "It should be" not in action  # it states no fix it could not have read
    # a listing without the function: it makes the known fix instead
    assert "It should be" in act_after("nothing here") and "<<'PY'" not in act_after("nothing here")
