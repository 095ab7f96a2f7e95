"""Claw teacher collection in real sandboxes: every variant completes in both harnesses under injected
faults; what did not complete, and what the wall clock cut (never graded, no reward), is not kept."""

from __future__ import annotations

import asyncio

import pytest

from orchard.data.trajectory import Message, ToolCall
from orchard.harness.claw import ClawHarness, claw_shell_harness
from orchard.harness.core import Conversation, Turn
from orchard.harness.episode import EpisodeRunner, SandboxPool
from orchard.tasks.claw.collect import collect, drop_reason
from orchard.tasks.claw.families import FAMILIES
from orchard.tasks.claw.oracle import VARIANTS, PlanPolicy, deliberate_mistake, plan_teacher
from orchard.tasks.claw.spec import PlanStep
from orchard.tasks.claw.task import ClawTask
from orchard.train.rl import score

pytestmark = [pytest.mark.usefixtures("orchestrator"), pytest.mark.slow]


def task(family: str, seed: int, **environment) -> ClawTask:
    module = FAMILIES[family]
    made = module.make(module.PARAMS[1], seed)
    return ClawTask(made.model_copy(update={"environment": made.environment.model_copy(update=environment)}))


async def test_every_variant_completes_in_both_harnesses_under_faults(aclient):
    tasks = [task("inbox_triage", 7, fault_rate=0.3, retry_after_seconds=0), task("document_edit", 8)]
    async with SandboxPool(2) as pool:
        runner = EpisodeRunner(aclient, concurrency=2, pool=pool)
        collection = await collect(runner, tasks, [ClawHarness(), claw_shell_harness()], plan_teacher(), 3,
                                   progress=False)
    summary = collection.summary()
    assert summary["kept"] == 12 and not collection.dropped, (summary, collection.errors)
    assert summary["by_harness"] == {"claw": 6, "claw-shell": 6}
    assert summary["by_variant"] == {f"claw-plan-{v}": 4 for v in VARIANTS}
    assert summary["with_faults"] > 0  # the teacher met faults and retried them to completion
    assert all(t.outcome.reward == 1.0 and t.metadata["claw"]["robustness"] == 1.0 for t in collection.kept)
    recovered = [t for t in collection.kept if t.policy == "claw-plan-recover" and t.harness == "claw"]
    assert all(any(m.role == "tool" and m.content.startswith("ERROR") for m in t.messages) for t in recovered)
    # The deliberate wrong call is named untaught (SFT teaches the recovery after it), in both harnesses; only it.
    for trajectory in recovered:
        calls = [m.tool_calls[0] for m in trajectory.messages if m.role == "assistant"]
        mistakes = [i for i, c in enumerate(calls) if deliberate_mistake(PlanStep(tool=c.name, arguments=c.arguments))]
        assert trajectory.metadata["untaught_actions"] == mistakes and len(mistakes) == 1
    assert all(len(t.metadata["untaught_actions"]) == 1 for t in collection.kept if t.policy == "claw-plan-recover")
    assert not any("untaught_actions" in t.metadata for t in collection.kept if t.policy != "claw-plan-recover")


class Dawdler:
    """Calls a tool, then waits past the wall clock."""

    name = "dawdler"

    async def act(self, conversation: Conversation, *, max_context: int | None = None) -> Turn:
        if any(m.role == "assistant" for m in conversation.messages):
            await asyncio.sleep(5)
        return Turn(Message(role="assistant", content="", tool_calls=[ToolCall(id="c", name="notifications_list",
                                                                               arguments={})]))


async def test_unfinished_and_timed_out_episodes_are_dropped_and_a_timeout_has_no_reward(aclient):
    quick = task("notification_cleanup", 3)
    slow = task("notification_cleanup", 4, time_budget_s=1.0)
    null = PlanPolicy([PlanStep(tool="finish", arguments={"answer": ""})])
    runner = EpisodeRunner(aclient, ClawHarness(), concurrency=2)
    unfinished, timed_out = await asyncio.gather(runner.run_one(quick, 1, policy=null),
                                                 runner.run_one(slow, 2, policy=Dawdler()))
    assert drop_reason(unfinished) == "not_completed" and unfinished.outcome.reward == -1.0
    assert timed_out.outcome.status == "timed_out" and timed_out.outcome.reward is None
    assert "claw" not in timed_out.metadata  # never graded
    assert drop_reason(timed_out) == "timed_out" and score(timed_out).reward is None  # GRPO leaves it out
