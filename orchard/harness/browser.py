"""The browser harness: the paper's generic ReAct loop over 13 atomic browser tools (Orchard-GUI).

Tools (OpenAI function schemas, :data:`TOOLS`): ``click``, ``hover``, ``drag``, ``write``,
``press_keys``, ``scroll``, ``goto_url``, ``go_back``, ``wait``, ``new_tab``, ``switch_tab``,
``close_tab`` and ``done(response)``. Coordinates are pixels of the screenshot, which is taken at
CSS scale, so they are the page's own click coordinates.

Each turn is one tool call (the paper's policy writes ``<think>...</think>`` then one
``<tool_call>``; :class:`~orchard.harness.policies.EnginePolicy` parses the Qwen3 format into it).
A turn that calls nothing, several tools, an unknown tool or breaks a schema is a format error
(:mod:`orchard.harness.tools`), answered with what was wrong and counted by the core. A valid call
that fails (a tab that does not exist, a URL that does not load) is an ordinary observation that
starts with ``ERROR:``.

After every action the model gets the tool's result (a ``tool`` message) and then a ``user``
message with the new screenshot (an :class:`~orchard.data.images.ImageRef`, the bytes in the
harness's :class:`~orchard.data.images.ImageStore`), the viewport and a tab summary, and with
``elements=True`` a list of visible elements and their centres (for text-only policies). The first
user message carries the first screenshot the same way. Policies keep only the last
``context_images`` screenshots in the prompt (the paper: k = 1).

The run ends when the policy calls ``done`` (its ``response`` is the submission) or when a page
ends the episode itself (MiniWoB's pages do, on a right or a wrong answer; the submission is then
empty and ``metadata["page_ended"]`` says so). A browser that crashed or hung raises
:class:`~orchard.harness.chromium.BrowserError`, which the core turns into a ``sandbox_error``.
"""

from __future__ import annotations

import base64
import json
import os
import weakref
from dataclasses import dataclass, field
from typing import Any

from orchard.data.images import ImageStore
from orchard.data.trajectory import Message, ToolCall, Trajectory
from orchard.env.client import AsyncSandbox
from orchard.harness.browser_actions import ActionFailed
from orchard.harness.chromium import browser_of
from orchard.harness.core import FormatError, Limits, Observation, Policy, Turn, run_agent
from orchard.harness.tools import checked_calls, reject_calls

_XY = {"x": {"type": "number", "description": "Horizontal pixel in the screenshot (0 is the left edge)."},
       "y": {"type": "number", "description": "Vertical pixel in the screenshot (0 is the top edge)."}}


def _tool(name: str, description: str, properties: dict[str, Any], required: list[str]) -> dict[str, Any]:
    return {"type": "function", "function": {"name": name, "description": description, "parameters": {
        "type": "object", "properties": properties, "required": required}}}


TOOLS: list[dict[str, Any]] = [
    _tool("click", "Click at a point of the screenshot.", {
        **_XY, "button": {"type": "string", "enum": ["left", "right", "middle"], "description": "Default left."},
        "clicks": {"type": "integer", "description": "2 for a double click. Default 1."}}, ["x", "y"]),
    _tool("hover", "Move the mouse to a point, without clicking.", dict(_XY), ["x", "y"]),
    _tool("drag", "Press the mouse at (x, y), move it to (to_x, to_y) and release it.", {
        **_XY, "to_x": {"type": "number", "description": "Where to release, horizontally."},
        "to_y": {"type": "number", "description": "Where to release, vertically."}}, ["x", "y", "to_x", "to_y"]),
    _tool("write", "Type text. With x and y, click there first (to focus a field); with clear, empty the "
                   "focused field first.", {
        "text": {"type": "string", "description": "The text to type."}, **_XY,
        "clear": {"type": "boolean", "description": "Select all and delete before typing. Default false."}},
        ["text"]),
    _tool("press_keys", "Press keys or key combinations, one after another, separated by spaces: "
                        "\"Enter\", \"Control+A Backspace\", \"ArrowDown ArrowDown Enter\".", {
        "keys": {"type": "string", "description": "Playwright key names, e.g. Enter, Tab, Escape, Control+C."}},
        ["keys"]),
    _tool("scroll", "Scroll with the mouse wheel at a point.", {
        **_XY, "delta_x": {"type": "number", "description": "Pixels to the right (negative: left). Default 0."},
        "delta_y": {"type": "number", "description": "Pixels down (negative: up). Default 0."}}, ["x", "y"]),
    _tool("goto_url", "Open a URL in the current tab.", {
        "url": {"type": "string", "description": "An http(s) or file URL."}}, ["url"]),
    _tool("go_back", "Go back to the previous page of the current tab.", {}, []),
    _tool("wait", "Wait for the page to change (at most 10 seconds).", {
        "seconds": {"type": "number", "description": "Seconds to wait. Default 1."}}, []),
    _tool("new_tab", "Open a new tab (optionally at a URL) and make it the current one.", {
        "url": {"type": "string", "description": "The URL to open; blank if omitted."}}, []),
    _tool("switch_tab", "Make another tab the current one.", {
        "index": {"type": "integer", "description": "The tab's index in the tab summary."}}, ["index"]),
    _tool("close_tab", "Close a tab (the current one if no index is given).", {
        "index": {"type": "integer", "description": "The tab's index in the tab summary."}}, []),
    _tool("done", "Finish the task, with the answer if the task asks for one.", {
        "response": {"type": "string", "description": "The final answer, or a short summary of what was done."}},
        ["response"]),
]
TOOL_NAMES = tuple(tool["function"]["name"] for tool in TOOLS)
MAX_WAIT_S = 10.0

_MARK = {"mark": {"type": "integer", "description": "The element's mark, [n] in the latest list."}}
# The marks mode's tools: act on a listed element by its mark (set-of-marks), a few hundred tokens of schema.
MARK_TOOLS: list[dict[str, Any]] = [
    _tool("click_mark", "Click an element.", dict(_MARK), ["mark"]),
    _tool("type_mark", "Type text into an element, replacing what it holds.", {
        **_MARK, "text": {"type": "string", "description": "The text to type."}}, ["mark", "text"]),
    _tool("press_keys", "Press keys, separated by spaces: \"Enter\", \"Tab\", \"ArrowDown Enter\".", {
        "keys": {"type": "string", "description": "Key names, e.g. Enter, Tab, Escape."}}, ["keys"]),
    _tool("done", "Finish the task, with the answer if it asks for one.", {
        "response": {"type": "string", "description": "The answer, or a short summary."}}, ["response"]),
]
STALE_MARK = "ERROR: no element has mark [{mark}] on the page now. Use a mark from the latest list."

SYSTEM_PROMPT = """\
You are a browser agent. You complete tasks in a web browser by looking at screenshots and acting with the tools.

Each turn: think about what the screenshot shows and what to do next inside <think>...</think>, then call \
exactly ONE tool. Coordinates are pixels of the latest screenshot. When the task is complete, call done with \
the answer (or a short summary if the task asks for no answer)."""

MARKS_SYSTEM_PROMPT = """\
You are a browser agent. You complete tasks in a web browser by looking at the page and acting with the tools.

Each turn shows a screenshot and the page's elements, each with a mark [n]. Think inside <think>...</think>, \
then call exactly ONE tool on an element by its mark. When the task is complete, call done."""

TASK_TEMPLATE = "Task: {task}"
NO_TOOL_CALL = "ERROR: you did not call a tool. Call exactly one tool each turn; call done when the task is complete."
ONE_CALL = "ERROR: call exactly one tool per turn; you called {count}. Nothing was run."


@dataclass
class BrowserHarness:
    """The 13-tool browser harness (see the module docstring).

    ``images``: where screenshots go (a workdir's ``images/``; default a fresh temporary directory,
    removed with the harness);
    ``elements``: add the visible elements' list to each observation; ``context_images``: how many
    of the latest screenshots a policy keeps in its prompt (recorded for the policies and the
    trainer; every screenshot stays in the trajectory).

    ``marks`` (set-of-marks, a departure from the paper's pixel interface for small policies): each
    observation lists the visible elements with a mark ``[n]`` beside the screenshot, and the tools are
    :data:`MARK_TOOLS`, which act on an element by its mark (a click at its centre; typing clicks it
    first and replaces its text). A mark is valid until the next observation; an older or unknown one
    is an ``ERROR:`` observation that names it (:data:`STALE_MARK`), and nothing is done.
    """

    images: ImageStore = field(default_factory=ImageStore.temporary)
    elements: bool = False
    context_images: int = 1
    system_prompt: str = SYSTEM_PROMPT
    task_template: str = TASK_TEMPLATE
    name: str = "browser"
    tools: list[dict[str, Any]] | None = field(default_factory=lambda: [dict(tool) for tool in TOOLS])
    marks: bool = False
    # each sandbox's latest marks, dropped with the sandbox
    _marked: weakref.WeakKeyDictionary = field(default_factory=weakref.WeakKeyDictionary, repr=False)

    def __post_init__(self) -> None:
        if self.marks:  # the mode's own tools, prompt and name (its trajectories are not the paper mode's)
            self.tools = [dict(tool) for tool in MARK_TOOLS]
            if self.system_prompt == SYSTEM_PROMPT:
                self.system_prompt = MARKS_SYSTEM_PROMPT
            if self.name == "browser":
                self.name = "browser-marks"

    def task_prompt(self, task: str) -> str:
        return self.task_template.format(task=task)

    async def opening(self, sandbox: AsyncSandbox) -> list[Message]:
        """What the policy sees before its first turn: the page as the task's set-up left it."""
        return [await self.page_message(sandbox, "The browser shows the task's start page.")]

    def parse(self, turn: Turn) -> list[ToolCall]:
        calls = checked_calls(turn, self.tools or [], NO_TOOL_CALL)
        if len(calls) != 1:
            raise FormatError(ONE_CALL.format(count=len(calls)))
        return calls

    async def execute(self, call: ToolCall, sandbox: AsyncSandbox) -> Observation:
        if call.name == "done":
            return Observation(Message(role="tool", content="Done.", tool_call_id=call.id),
                               submission=str(call.arguments["response"]))
        browser = browser_of(sandbox)
        action, arguments = call.name, dict(call.arguments)
        if action in ("click_mark", "type_mark"):  # the marks mode's: the element's centre, as the paper's tools
            element = self._marked.get(sandbox, {}).get(arguments["mark"])
            if element is None:
                return Observation(Message(role="tool", content=STALE_MARK.format(mark=arguments["mark"]),
                                           tool_call_id=call.id), then=[await self.page_message(sandbox, "")])
            centre = {"x": element["x"], "y": element["y"]}
            action, arguments = (("click", centre) if action == "click_mark"
                                 else ("write", {"text": arguments["text"], **centre, "clear": True}))
        if action == "wait":
            arguments["seconds"] = max(0.0, min(float(arguments.get("seconds", 1.0)), MAX_WAIT_S))
        try:
            result = await browser.call(action, **arguments)
        except ActionFailed as exc:
            result = f"ERROR: {exc}"
        answer = Message(role="tool", content=str(result), tool_call_id=call.id)
        page = await self.page_message(sandbox, "")
        ended = next((event for event in browser.events if event.get("ends_episode")), None)
        if ended is not None:  # the page ended the episode itself (MiniWoB): the run is over
            return Observation(answer, submission="", metadata={"page_ended": True})
        return Observation(answer, then=[page])

    async def page_message(self, sandbox: AsyncSandbox, note: str) -> Message:
        """The user turn that shows the page: a screenshot, the viewport, the tabs (and elements)."""
        browser = browser_of(sandbox)
        png = base64.b64decode(await browser.call("screenshot"))
        image = self.images.put_png(png)
        tabs = await browser.call("tab_summary")
        width, height = browser.settings.viewport
        lines = [note] if note else []
        lines.append(f"Viewport: {width}x{height} pixels. Tabs:")
        lines += [f"{'*' if tab['active'] else ' '} [{tab['index']}] {tab['title'] or '(untitled)'} - {tab['url']}"
                  for tab in tabs]
        if self.marks:
            found = await browser.call("elements")
            self._marked[sandbox] = dict(enumerate(found, 1))
            lines.append("Elements:")
            lines += [f"[{mark}] {_element_label(e)}" for mark, e in enumerate(found, 1)]
        elif self.elements:
            found = await browser.call("elements")
            lines.append("Elements (tag, text, centre x,y):")
            lines += [f"- {_element_label(e)} at {e['x']},{e['y']}" for e in found]
        return Message(role="user", content="\n".join(lines), images=[image])

    def reject(self, turn: Turn, error: FormatError) -> list[Message]:
        return reject_calls(turn, error)

    async def run(self, task: str, policy: Policy, sandbox: AsyncSandbox, *, limits: Limits = Limits(),
                  **options: Any) -> Trajectory:
        """:func:`~orchard.harness.core.run_agent` with this harness (options: task_id, seed, metadata)."""
        return await run_agent(self, policy, sandbox, task, limits=limits, **options)


def _element_label(element: dict[str, Any]) -> str:
    """How an observation names a listed element: its tag, its id and its text."""
    return f"{element['tag']}{'#' + element['id'] if element['id'] else ''} {json.dumps(element['text'])}"


def screenshots(trajectory: Trajectory, store: ImageStore | str | os.PathLike, last: int | None = None) -> list[bytes]:
    """The screenshots of a trajectory, in order (the ``last`` ones), read from ``store``."""
    store = store if isinstance(store, ImageStore) else ImageStore(store)
    refs = [image for message in trajectory.messages for image in message.images]
    return [store.read(ref) for ref in (refs[-last:] if last else refs)]
