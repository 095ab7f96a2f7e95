"""The Claw teacher without a model: a task's reference plan said one tool call a turn.

It is what the generator checked (the plan passes every test), so through a harness it solves the task
unless the environment gets in the way (an injected fault it does not retry: it says its plan as
written). A later turn past the plan repeats the last step (``finish``)."""

from __future__ import annotations

from orchard.data.trajectory import Message, ToolCall
from orchard.harness.core import Conversation, Turn
from orchard.tasks.claw.spec import PlanStep


class PlanPolicy:
    """Says ``steps`` in order, one tool call a turn, to the ReAct harness (:class:`~orchard.harness.claw.ClawHarness`)."""

    name = "claw-plan"

    def __init__(self, steps: list[PlanStep]) -> None:
        if not steps:
            raise ValueError("a plan needs at least one step")
        self.steps = steps

    async def act(self, conversation: Conversation, *, max_context: int | None = None) -> Turn:
        done = sum(message.role == "assistant" for message in conversation.messages)
        step = self.steps[min(done, len(self.steps) - 1)]
        call = ToolCall(id=f"call_{done}", name=step.tool, arguments=step.arguments)
        return Turn(Message(role="assistant", content="", tool_calls=[call]))
