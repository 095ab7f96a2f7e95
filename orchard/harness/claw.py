"""The Claw harness: a ReAct loop over a task's tool services (Orchard-Claw, Claw-Eval's style).

The tools are the task's, not the harness's. A Claw task's set-up writes :data:`TOOLS_PATH` into
the sandbox: OpenAI function schemas, each with its HTTP binding under :data:`ROUTE_KEY`
(``{"method", "path", "port"}``; ``{name}`` placeholders in the path are filled from the
arguments, the other arguments go in the query of a GET or DELETE and in the JSON body otherwise).
At the start of an episode the harness reads that file (``tools_for``), shows the model the schemas
without their bindings, and runs each call as an HTTP request to the services on the sandbox's
loopback, through the port forward (:meth:`~orchard.env.client.AsyncSandbox.port_request`).

- **Tool errors are observations**, so recovery can be learnt: a 4xx or 5xx from a service, a 429
  with its ``Retry-After``, an unknown tool or arguments that break the schema come back as the
  tool's answer, starting with ``ERROR``. Only a turn with no parsable call is a format error.
- **No step cap** (the paper's Claw setting): the wall clock ends a run, 600 s by default
  (:data:`DEFAULT_LIMITS`), and a run cut by it is excluded from training by the core.
- ``finish(answer)`` posts the answer to the services, where graders read it (never from the
  transcript), and ends the run with the answer as the submission.

Several calls in one turn run in order. Answers longer than :data:`MAX_ANSWER_CHARS` are cut.

:func:`claw_shell_harness` is the second style, mini-swe-agent's: no tools, one shell command a turn
(:class:`~orchard.harness.bash.BashHarness`), and the same services reached through the command-line
tools a Claw task installs in the sandbox, one per tool (``mail_list --folder inbox``).
:func:`claw_smolagents_harness` is a third, which Orchard does not control: smolagents' ``CodeAgent`` as
an external process, over the same command-line tools.
"""

from __future__ import annotations

import json
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote

from orchard.data.trajectory import Message, ToolCall, Trajectory
from orchard.env.client import AsyncSandbox
from orchard.harness.adapters.external import ExternalHarness
from orchard.harness.adapters.smolagents_agent import smolagents_harness
from orchard.harness.bash import SUBMIT_SENTINEL, BashHarness
from orchard.harness.core import DEFAULT_MAX_TURNS, FormatError, Limits, Observation, Policy, Turn, run_agent
from orchard.harness.tools import check_arguments, checked_calls, reject_calls

TOOLS_PATH = "/etc/orchard/claw/tools.json"
ROUTE_KEY = "x-orchard-route"
FINISH = "finish"
MAX_ANSWER_CHARS = 8000
DEFAULT_LIMITS = Limits(max_turns=10_000, time_limit=600.0, max_format_errors=5)

SYSTEM_PROMPT = """You are a personal assistant working for the user through tools: mail, calendar, contacts, \
to-do lists, notifications and documents, as this task provides them.

Each turn, think briefly, then call one or more tools. Tool answers are JSON. A tool may fail \
(a rate limit, a server error): read the error and retry or work around it. Never do what the user \
did not ask for, and never take an irreversible or unsafe action the task does not call for.

When the task is done, call finish with a short answer for the user."""

TASK_TEMPLATE = "{task}"
NO_TOOL_CALL = "ERROR: you did not call a tool. Call a tool each turn; call finish when the task is done."


def http_request_for(route: dict[str, Any], arguments: dict[str, Any]) -> tuple[str, str, dict, Any]:
    """``(method, path, query, body)`` of a tool call under its HTTP binding (see the module docstring)."""
    method, path = route["method"].upper(), route["path"]
    rest = dict(arguments)
    while "{" in path:
        start, end = path.index("{"), path.index("}")
        name = path[start + 1:end]
        if name not in rest:
            raise FormatError(f"missing required parameter(s): {name}")
        path = path[:start] + quote(str(rest.pop(name)), safe="") + path[end + 1:]
    if method in ("GET", "DELETE"):
        return method, path, rest, None
    return method, path, {}, rest


def tool_answer(status: int, headers: dict[str, str], text: str) -> str:
    """What the model reads of a service's reply: the body, or ``ERROR <status>`` and why."""
    if len(text) > MAX_ANSWER_CHARS:
        text = text[:MAX_ANSWER_CHARS] + f"\n... [cut: {len(text) - MAX_ANSWER_CHARS} more characters]"
    if status < 400:
        return text
    retry = headers.get("Retry-After") or headers.get("retry-after")
    note = f" (retry after {retry} s)" if retry else ""
    return f"ERROR {status}{note}: {text}"


@dataclass
class ClawHarness:
    """The ReAct harness over a task's tool services (see the module docstring)."""

    system_prompt: str = SYSTEM_PROMPT
    task_template: str = TASK_TEMPLATE
    name: str = "claw"
    tools: list[dict[str, Any]] | None = None  # the episode's come from the sandbox (tools_for)
    request_timeout: float = 60.0
    _routes: OrderedDict[str, dict[str, dict]] = field(default_factory=OrderedDict, repr=False)

    def task_prompt(self, task: str) -> str:
        return self.task_template.format(task=task)

    async def tools_for(self, sandbox: AsyncSandbox) -> list[dict[str, Any]]:
        """The task's tools as the model sees them; their bindings are kept for :meth:`execute`."""
        listed = json.loads(await sandbox.read_file(TOOLS_PATH))
        routes = {tool["function"]["name"]: {**tool[ROUTE_KEY], "schema": tool["function"]["parameters"]}
                  for tool in listed}
        self._routes[sandbox.id] = routes
        while len(self._routes) > 4096:  # the harness serves many episodes; keep the recent ones
            self._routes.popitem(last=False)
        return [{key: value for key, value in tool.items() if key != ROUTE_KEY} for tool in listed]

    def parse(self, turn: Turn) -> list[ToolCall]:
        return checked_calls(turn, None, NO_TOOL_CALL)

    async def execute(self, call: ToolCall, sandbox: AsyncSandbox) -> Observation:
        routes = self._routes.get(sandbox.id)
        if routes is None:
            await self.tools_for(sandbox)
            routes = self._routes[sandbox.id]
        route = routes.get(call.name)
        try:
            if route is None:
                raise FormatError(f"there is no tool named {call.name!r}. The tools are: {', '.join(routes)}.")
            if not isinstance(call.arguments, dict):
                raise FormatError(f"the arguments must be a JSON object, got {call.arguments!r}")
            check_arguments(route["schema"], call.arguments)
            method, path, query, body = http_request_for(route, call.arguments)
        except FormatError as exc:
            return Observation(Message(role="tool", content=f"ERROR: {exc}", tool_call_id=call.id))
        reply = await sandbox.port_request(int(route["port"]), method, path, params=query or None, json=body,
                                           read_timeout=self.request_timeout)
        answer = Message(role="tool", content=tool_answer(reply.status, dict(reply.headers), reply.text),
                         tool_call_id=call.id)
        if call.name == FINISH and reply.status < 400:
            return Observation(answer, submission=str(call.arguments.get("answer", "")))
        return Observation(answer)

    def reject(self, turn: Turn, error: FormatError) -> list[Message]:
        return reject_calls(turn, error)

    async def run(self, task: str, policy: Policy, sandbox: AsyncSandbox, *, limits: Limits = DEFAULT_LIMITS,
                  **options: Any) -> Trajectory:
        """:func:`~orchard.harness.core.run_agent` with this harness (options: task_id, seed, metadata)."""
        return await run_agent(self, policy, sandbox, task, limits=limits, **options)


SHELL_SYSTEM_PROMPT = """\
You are a personal assistant who works for the user by running shell commands, one at a time.

Every response has two parts:
1. A THOUGHT section: what you know so far and why you run the next command.
2. Exactly ONE bash code block holding ONE command (join several steps with && or ||).

<format_example>
THOUGHT: I should first see the unread mail.

```bash
mail_list --unread true
```
</format_example>

A response with no bash block, or with more than one, is rejected."""

SHELL_SUBMIT_COMMAND = f'echo {SUBMIT_SENTINEL} && finish --answer "your answer"'
SHELL_TASK_TEMPLATE = """\
<task>
{task}
</task>

<instructions>
The user's mail, calendar, contacts, to-do list, notifications and documents are reached through commands, \
one per action: run `claw-tools` to list them and `COMMAND --help` for a command's options. They print JSON. \
A command may fail (a rate limit, a server error): read the error, then retry or work around it. Never do what \
the user did not ask for.

Each command runs in a new shell in {cwd} and is killed after {timeout:g} seconds.

When the task is done, give the user a short answer with this command, alone in its block:

```bash
{submit}
```

After that you cannot run anything else.
</instructions>"""


EXTERNAL_TASK_TEMPLATE = """\
You are a personal assistant. The user asks:

{task}

The user's mail, calendar, contacts, to-do list, notifications and documents are reached through shell \
commands, one per action, run with your bash tool: `claw-tools` lists them and `COMMAND --help` shows a \
command's options. They print JSON. A command may fail (a rate limit, a server error): read the error, then \
retry or work around it. Never do what the user did not ask for. When the task is done, run \
`finish --answer "..."` with a short answer for the user, then end."""


def claw_smolagents_harness(max_turns: int = DEFAULT_MAX_TURNS, wall_clock_s: float = 600.0,
                            max_tokens: int | None = None) -> ExternalHarness:
    """A harness Orchard does not control on Claw tasks: smolagents' ``CodeAgent`` in its own process
    (:mod:`~orchard.harness.adapters.smolagents_agent`), its ``bash`` tool reaching the services through
    the tasks' command-line tools, told so by :data:`EXTERNAL_TASK_TEMPLATE`. It submits nothing: the
    grading reads the services' state, as for every Claw harness."""
    return smolagents_harness(max_turns, wall_clock_s=wall_clock_s, max_tokens=max_tokens,
                              task_template=EXTERNAL_TASK_TEMPLATE)


def claw_shell_harness(cwd: str = "/workspace", command_timeout: float = 60.0) -> BashHarness:
    """The shell-style Claw harness (see the module docstring): its submission is what ``finish`` printed."""
    return BashHarness(cwd=cwd, command_timeout=command_timeout, system_prompt=SHELL_SYSTEM_PROMPT,
                       task_template=SHELL_TASK_TEMPLATE, name="claw-shell", submit_command=SHELL_SUBMIT_COMMAND)
