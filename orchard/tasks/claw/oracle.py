"""The Claw teacher without a model: a task's reference plan said one tool call a turn.

:class:`PlanPolicy` says a list of steps in order, one a turn, in either harness style: as an OpenAI
tool call to the ReAct harness (:class:`~orchard.harness.claw.ClawHarness`, ``style="tools"``), or as
one shell command over the task's command-line tools to the shell harness
(:func:`~orchard.harness.claw.claw_shell_harness`, ``style="shell"``). It reads nothing of the tools'
answers but whether the last call met a service fault (a 429 or a 5xx, which it retries when
``retry_faults``): a reference plan names every id it needs, since the generator wrote both.

:func:`teacher_script` gives the teacher's steps of one episode, by variant, as the paper's teacher
trajectories vary (section 3.5 of the notes):

- ``clean``: the reference plan;
- ``wander``: the plan with one or two read-only calls it does not need, at seeded places;
- ``recover``: the plan with one wrong call before a step (an id that does not exist, or a required
  argument left out), whose error the next turn answers by making the call right; a plan with no call
  that takes an id or needs an argument (a quick action's one search) runs as it is. The policy
  records the turns of its deliberate mistakes (:attr:`PlanPolicy.untaught`), and collection keeps
  them on the trajectory (``metadata["untaught_actions"]``): SFT teaches the recovery, not the
  mistake (:func:`orchard.data.examples.trained_actions`). A policy trained on the mistakes too
  called ``x-missing-0`` first on held-out tasks.

Every variant retries a faulted call. The generator checked the reference plan (it passes every test),
so the variants solve the task unless the environment gets in the way; collection keeps only the
episodes that did (:mod:`orchard.tasks.claw.collect`). A turn past the script repeats its last step.
"""

from __future__ import annotations

import json
import re
import shlex
from collections.abc import Callable, Sequence
from typing import Literal

from orchard.data.trajectory import Message, ToolCall
from orchard.harness.bash import SUBMIT_SENTINEL
from orchard.harness.claw import ClawHarness
from orchard.harness.core import Conversation, Harness, Turn
from orchard.seeds import seeded_random
from orchard.tasks.claw.services.tools import tool_by_name
from orchard.tasks.claw.spec import ClawTaskSpec, PlanStep

Style = Literal["tools", "shell"]
VARIANTS = ("clean", "wander", "recover")
FAULT = re.compile(r"\b(?:ERROR|HTTP) (?:429|5\d\d)\b")  # a service fault, as either harness shows it
MISSING_ID = "x-missing-0"


def harness_style(harness: Harness) -> Style:
    """How the teacher speaks to ``harness``: tool calls to the ReAct harness, shell commands to any other."""
    return "tools" if isinstance(harness, ClawHarness) else "shell"


def is_fault(observation: str) -> bool:
    """Whether a tool's answer (either harness's) is a service fault a robust agent retries."""
    return bool(FAULT.search(observation))


def shell_command(step: PlanStep) -> str:
    """The command line of one step over the task's command-line tools (``finish`` ends the episode)."""
    arguments: list[str] = []
    nested = any(isinstance(v, (dict, list)) and (isinstance(v, dict) or any("," in str(i) for i in v))
                 for v in step.arguments.values())
    if nested:  # the CLI splits list items on commas: say such arguments as one JSON object
        arguments = ["--json", json.dumps(step.arguments, ensure_ascii=False)]
    else:
        for name, value in step.arguments.items():
            if isinstance(value, bool):
                arguments += [f"--{name}", "true" if value else "false"]
            elif isinstance(value, list):
                arguments += [f"--{name}", *map(str, value)] if value else []
            else:
                arguments += [f"--{name}", str(value)]
    command = shlex.join([step.tool, *arguments])
    return f"echo {SUBMIT_SENTINEL} && {command}" if step.tool == "finish" else command


class PlanPolicy:
    """Says ``steps`` in order, one a turn, as tool calls (``style="tools"``) or shell commands
    (``"shell"``); with ``retry_faults``, a call that met a service fault is said again."""

    def __init__(self, steps: Sequence[PlanStep], style: Style = "tools", *, retry_faults: bool = False,
                 name: str = "claw-plan") -> None:
        if not steps:
            raise ValueError("a plan needs at least one step")
        if style not in ("tools", "shell"):
            raise ValueError(f"unknown style {style!r}: tools or shell")
        self.steps, self.style, self.retry_faults, self.name = list(steps), style, retry_faults, name
        self.untaught: list[int] = []  # the turns (action indices) that said a deliberate mistake

    def position(self, conversation: Conversation) -> tuple[int, bool]:
        """The index of the step to say next, and whether the last call failed (its answer an error)."""
        messages = conversation.messages
        position, failed = 0, False
        for index, message in enumerate(messages):
            if message.role != "assistant":
                continue
            answer = next((m.content for m in messages[index + 1:] if m.role in ("tool", "user")), "")
            failed = (answer.startswith("ERROR") if self.style == "tools"
                      else "<returncode>0</returncode>" not in answer)
            if not (self.retry_faults and is_fault(answer)):
                position += 1
        return position, failed

    async def act(self, conversation: Conversation, *, max_context: int | None = None) -> Turn:
        position, failed = self.position(conversation)
        step = self.steps[min(position, len(self.steps) - 1)]
        turn = sum(message.role == "assistant" for message in conversation.messages)
        if deliberate_mistake(step) and turn not in self.untaught:
            self.untaught.append(turn)
        if self.style == "tools":
            call = ToolCall(id=f"call_{turn}", name=step.tool, arguments=step.arguments)
            return Turn(Message(role="assistant", content="", tool_calls=[call]))
        thought = ("That failed; I run it again, fixed." if failed and turn else
                   "I give the user the answer." if step.tool == "finish" else f"Next: {step.tool}.")
        return Turn(Message(role="assistant", content=f"THOUGHT: {thought}\n\n```bash\n{shell_command(step)}\n```"))


def _read_only(spec: ClawTaskSpec) -> list[PlanStep]:
    """Calls of the task's tools that change nothing and need no argument (``mail_list``, ...)."""
    steps = []
    for name in spec.tools:
        tool = tool_by_name(name)
        if tool.method == "GET" and not tool.parameters["required"]:
            steps.append(PlanStep(tool=name, arguments={}))
    return steps


def deliberate_mistake(step: PlanStep) -> bool:
    """Whether ``step`` is a wrong call the ``recover`` variant made on purpose (:func:`_wrong_call`): an id that
    does not exist, or a required argument left out. A reference plan has neither (the generator ran it)."""
    if step.arguments.get("id") == MISSING_ID:
        return True
    return any(name not in step.arguments for name in tool_by_name(step.tool).parameters["required"])


def _wrong_call(step: PlanStep) -> PlanStep:
    """A call of ``step``'s tool its service or schema rejects: a missing id, or a required argument left out."""
    if "id" in step.arguments:
        return PlanStep(tool=step.tool, arguments={**step.arguments, "id": MISSING_ID})
    required = tool_by_name(step.tool).parameters["required"]
    dropped = required[0]
    return PlanStep(tool=step.tool, arguments={k: v for k, v in step.arguments.items() if k != dropped})


def teacher_script(spec: ClawTaskSpec, variant: str, seed: int) -> list[PlanStep]:
    """The teacher's steps for one episode of ``spec`` (see the module docstring); seeded by ``seed``."""
    if variant not in VARIANTS:
        raise ValueError(f"unknown teacher variant {variant!r}: one of {', '.join(VARIANTS)}")
    plan = list(spec.reference_plan)
    rng = seeded_random(seed, "claw-oracle", spec.id, variant)
    body = len(plan) - 1 if plan[-1].tool == "finish" else len(plan)
    if variant == "wander" and (reads := _read_only(spec)):
        for _ in range(rng.randint(1, 2)):
            plan.insert(rng.randint(0, body), rng.choice(reads))
            body += 1
    elif variant == "recover":
        fixable = [i for i, step in enumerate(plan[:body])
                   if "id" in step.arguments or tool_by_name(step.tool).parameters["required"]]
        if fixable:
            at = rng.choice(fixable)
            plan.insert(at, _wrong_call(plan[at]))
    return plan


TeacherFactory = Callable[[ClawTaskSpec, Style, int], PlanPolicy]  # (task, harness style, sample index)


def plan_teacher(variants: Sequence[str] = VARIANTS) -> TeacherFactory:
    """The oracle teacher of (task, style, sample ``k``): variant ``variants[k % len(variants)]``, faults retried."""
    if not variants or set(variants) - set(VARIANTS):
        raise ValueError(f"teacher variants must be some of {', '.join(VARIANTS)}, got {list(variants)}")

    def teacher(spec: ClawTaskSpec, style: Style, k: int) -> PlanPolicy:
        variant = variants[k % len(variants)]
        return PlanPolicy(teacher_script(spec, variant, k), style, retry_faults=True, name=f"claw-plan-{variant}")

    return teacher
