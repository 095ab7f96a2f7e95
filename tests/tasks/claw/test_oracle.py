"""The Claw teacher: its variants keep the plan's effects, its shell commands say exactly the plan's
arguments (read back by the CLI's own parser), and it retries only service faults."""

from __future__ import annotations

import asyncio
import shlex

import pytest

from orchard.data.trajectory import Message
from orchard.harness.bash import SUBMIT_SENTINEL
from orchard.harness.claw import ClawHarness, claw_shell_harness
from orchard.harness.core import Conversation
from orchard.tasks.claw.families import FAMILIES
from orchard.tasks.claw.oracle import (
    MISSING_ID,
    PlanPolicy,
    deliberate_mistake,
    harness_style,
    is_fault,
    plan_teacher,
    shell_command,
    teacher_script,
)
from orchard.tasks.claw.services.cli import tool_arguments, tool_parser
from orchard.tasks.claw.services.tools import tool_by_name
from orchard.tasks.claw.spec import PlanStep

SPECS = [family.make(family.PARAMS[0], seed) for family in FAMILIES.values() for seed in (0, 1)]


@pytest.mark.parametrize("spec", SPECS, ids=lambda s: f"{s.id}")
def test_variants_add_only_read_only_or_rejected_calls(spec):
    plan = spec.reference_plan
    assert teacher_script(spec, "clean", 0) == plan
    wander = teacher_script(spec, "wander", 3)
    extra = [step for step in wander if step not in plan]
    assert 1 <= len(wander) - len(plan) <= 2 and wander[-1] == plan[-1]
    assert all(tool_by_name(step.tool).method == "GET" for step in extra)
    recover = teacher_script(spec, "recover", 3)
    if not any("id" in step.arguments or tool_by_name(step.tool).parameters["required"] for step in plan[:-1]):
        assert recover == plan  # a quick action's one search takes no id and needs no argument: nothing to get wrong
        return
    assert len(recover) == len(plan) + 1
    wrong = next(i for i, step in enumerate(recover) if i >= len(plan) or step != plan[i])
    assert recover[wrong].tool == recover[wrong + 1].tool  # the wrong call, then the right one
    bad = recover[wrong].arguments
    assert bad.get("id") == MISSING_ID or set(bad) < set(recover[wrong + 1].arguments)
    assert [deliberate_mistake(step) for step in recover] == [i == wrong for i in range(len(recover))]
    assert teacher_script(spec, "wander", 3) == wander  # seeded


@pytest.mark.parametrize("spec", SPECS, ids=lambda s: f"{s.id}")
def test_shell_commands_carry_exactly_the_plan_arguments(spec):
    for step in spec.reference_plan:
        command = shell_command(step)
        if step.tool == "finish":
            assert command.startswith(f"echo {SUBMIT_SENTINEL} && finish ")
            command = command.split(" && ", 1)[1]
        argv = shlex.split(command)
        tool = tool_by_name(argv[0])
        assert tool_arguments(tool, tool_parser(tool), argv[1:]) == step.arguments


def test_a_list_item_with_a_comma_goes_as_json():
    step = PlanStep(tool="mail_send", arguments={"to": ["a@x.org"], "subject": "Hi", "body": "x",
                                                 "cc": ["Doe, Jane <j@x.org>"]})
    argv = shlex.split(shell_command(step))
    assert argv[1] == "--json"
    tool = tool_by_name("mail_send")
    assert tool_arguments(tool, tool_parser(tool), argv[1:]) == step.arguments


def conversation(*exchanges: tuple[str, str], role: str = "tool") -> Conversation:
    messages = [Message(role="system", content="s"), Message(role="user", content="task")]
    for said, answer in exchanges:
        messages += [Message(role="assistant", content=said), Message(role=role, content=answer)]
    return Conversation(messages=messages)


def test_faults_are_retried_and_other_errors_move_on():
    steps = [PlanStep(tool="mail_list", arguments={}), PlanStep(tool="todo_list", arguments={}),
             PlanStep(tool="finish", arguments={"answer": "done"})]
    policy = PlanPolicy(steps, retry_faults=True)
    assert policy.position(conversation(("", "ERROR 429 (retry after 1 s): {}"))) == (0, True)
    assert policy.position(conversation(("", "ERROR 503: {}"), ("", '{"messages": []}'))) == (1, False)
    assert policy.position(conversation(("", "ERROR 404: no such message"))) == (1, True)  # not a fault: on
    assert PlanPolicy(steps).position(conversation(("", "ERROR 500: {}"))) == (1, True)  # no retries asked
    shell = PlanPolicy(steps, "shell", retry_faults=True)
    answer = "<returncode>1</returncode>\n<output>\nHTTP 429 (Retry-After: 1): {}\n</output>"
    assert shell.position(conversation(("x", answer), role="user")) == (0, True)
    turn = asyncio.run(shell.act(conversation(("x", answer), role="user")))
    assert turn.message.content.startswith("THOUGHT: That failed") and "```bash\nmail_list\n```" in turn.message.content
    assert is_fault("HTTP 500: boom") and not is_fault("HTTP 404: gone") and not is_fault("ERROR: bad arguments")


def test_the_teacher_cycles_variants_and_speaks_each_harness_style():
    spec = SPECS[0]
    teacher = plan_teacher(("clean", "recover"))
    assert [teacher(spec, "tools", k).name for k in range(3)] == ["claw-plan-clean", "claw-plan-recover",
                                                                  "claw-plan-clean"]
    assert harness_style(ClawHarness()) == "tools" and harness_style(claw_shell_harness()) == "shell"
    with pytest.raises(ValueError, match="teacher variants"):
        plan_teacher(("clean", "sloppy"))
    with pytest.raises(ValueError, match="unknown teacher variant"):
        teacher_script(spec, "sloppy", 0)
