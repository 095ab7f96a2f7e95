"""The GUI oracle teacher: a scripted policy that solves GUI tasks through the real browser harness.

Like the SWE oracle, it is not a model and learns nothing; it makes the GUI pipeline (collection,
SFT data, the RL loop's plumbing) run on real browser interaction without an API key. Each turn it
asks its task for the next action (:meth:`next_action` of a GUI task: MiniWoB's solvers read the
live DOM, the local sites' plans read the open tabs), which is privileged information a policy never
gets, and writes the turn a Qwen3-style model would: a short ``<think>`` (as ``reasoning``) and one
tool call. Every observation it gets back is the real browser's.

Variants make the data realistic:

- ``clean``: the solver's actions, then ``done``;
- ``wander``: the same with one to three harmless detours (a hover, a small scroll, a short wait)
  at random turns;
- ``fail``: one wrong action (a click somewhere the solver would not click, or a wrong answer on
  the sites), then ``done``: the failed trajectories a judge must catch.

With ``marks`` it writes the calls of the harness's set-of-marks mode (:data:`~orchard.harness.browser.MARK_TOOLS`):
a click or a typed text at a point goes to the smallest listed element whose box holds it
(:func:`mark_action`); an action that mode has no tool for (a drag, a scroll, typing into the focused field)
ends the episode with ``done``, so such pages are not solved in that mode. Its detours are left out (the
mode has no harmless action to make).
"""

from __future__ import annotations

import random
import uuid
from dataclasses import dataclass
from typing import Any, Literal, Protocol

from orchard.data.trajectory import Message, ToolCall
from orchard.harness.chromium import SandboxBrowser, browser_of
from orchard.harness.core import Conversation, Turn
from orchard.seeds import seeded_random

Variant = Literal["clean", "wander", "fail"]
VARIANTS: tuple[Variant, ...] = ("clean", "wander", "fail")


class OracleTask(Protocol):
    """What the oracle needs of a GUI task."""

    @property
    def prompt(self) -> str: ...

    async def next_action(self, browser: SandboxBrowser, memory: dict[str, Any]) -> dict[str, Any] | None:
        """The next action (``{"tool", "args"}``) toward success, or ``None`` when none is left;
        ``memory`` is the episode's, for plans that count their steps."""
        ...

    def wrong_action(self, rng: random.Random, viewport: tuple[int, int]) -> dict[str, Any]:
        """An action that does not solve the task (the ``fail`` variant's)."""
        ...


@dataclass
class GUIOracle:
    """The oracle teacher for ``task`` (see the module docstring); ``seed`` varies the detours."""

    task: OracleTask
    variant: Variant = "clean"
    seed: int = 0
    name: str = "gui-oracle"
    marks: bool = False  # write the set-of-marks mode's calls (see the module docstring)

    async def act(self, conversation: Conversation, *, max_context: int | None = None) -> Turn:
        if conversation.sandbox is None:
            raise RuntimeError("the GUI oracle reads the page it acts on: it needs the episode's sandbox")
        browser = browser_of(conversation.sandbox)
        state = conversation.state.setdefault(("gui-oracle", id(self)), self._plan(conversation.seed))
        rng: random.Random = state["rng"]
        turn = sum(message.role == "assistant" for message in conversation.messages)
        if turn in state["detours"]:
            action, thought = self._detour(rng, browser.settings.viewport), "Let me look around the page first."
        elif self.variant == "fail" and not state["failed"]:
            state["failed"] = True
            action, thought = self.task.wrong_action(rng, browser.settings.viewport), "I think this is it."
        elif self.variant == "fail":
            action, thought = {"tool": "done", "args": {"response": "I could not complete the task."}}, "I am stuck."
        else:
            action = await self.task.next_action(browser, state["memory"])
            if action is None:
                action = {"tool": "done", "args": {"response": ""}}
            thought = f"The task: {self.task.prompt} Next I {_describe(action)}."
        if self.marks:  # the page's elements only where the action points at one
            elements = await browser.call("elements") if action["tool"] in ("click", "write") else []
            action = mark_action(action, elements) or {"tool": "done", "args": {"response": ""}}
        call = ToolCall(id=f"call_{uuid.uuid4().hex[:24]}", name=action["tool"], arguments=dict(action["args"]))
        return Turn(Message(role="assistant", content="", reasoning=thought, tool_calls=[call]))

    def _plan(self, episode_seed: int) -> dict[str, Any]:
        rng = seeded_random(self.seed, "gui-oracle", episode_seed)
        detours = set(rng.sample(range(4), rng.randint(1, 3))) if self.variant == "wander" and not self.marks else set()
        return {"rng": rng, "detours": detours, "failed": False, "memory": {}}

    @staticmethod
    def _detour(rng: random.Random, viewport: tuple[int, int]) -> dict[str, Any]:
        width, height = viewport
        x, y = rng.randrange(width), rng.randrange(height // 2, height)
        return rng.choice([{"tool": "hover", "args": {"x": x, "y": y}},
                           {"tool": "scroll", "args": {"x": x, "y": y, "delta_y": 0}},
                           {"tool": "wait", "args": {"seconds": 0.1}}])


def element_at(elements: list[dict[str, Any]], x: float, y: float) -> int | None:
    """The mark (counted from 1, as the harness lists them) of the smallest element whose box holds (x, y)."""
    holding = [(e["width"] * e["height"], mark) for mark, e in enumerate(elements, 1)
               if abs(x - e["x"]) <= e["width"] / 2 and abs(y - e["y"]) <= e["height"] / 2]
    return min(holding)[1] if holding else None


def mark_action(action: dict[str, Any], elements: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The set-of-marks call for a solver's action on the page whose visible ``elements`` the harness listed:
    a click or a write at a point on the element there; ``done`` and ``press_keys`` as they are; None for an
    action the mode cannot make."""
    tool, args = action["tool"], action["args"]
    if tool in ("done", "press_keys"):
        return action
    if tool not in ("click", "write") or "x" not in args or "y" not in args:
        return None
    mark = element_at(elements, args["x"], args["y"])
    if mark is None:
        return None
    if tool == "click":
        return {"tool": "click_mark", "args": {"mark": mark}}
    return {"tool": "type_mark", "args": {"mark": mark, "text": args["text"]}}


def _describe(action: dict[str, Any]) -> str:
    args = action["args"]
    if "x" in args and "y" in args:
        return f"{action['tool']} at ({args['x']}, {args['y']})"
    return f"call {action['tool']}({', '.join(f'{k}={v!r}' for k, v in args.items())})"
