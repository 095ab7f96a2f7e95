"""The CodeAct harness, in OpenHands' style: OpenAI tool calling with three tools.

- ``execute_bash(command, timeout?)``: a command in a fresh bash shell in the repository, stdout
  and stderr interleaved, then ``[The command completed with exit code N.]``. Long outputs keep
  their head and tail. Unlike OpenHands' persistent terminal, ``cd`` and ``export`` do not carry
  over (the description says so).
- ``str_replace_editor(command, path, ...)``: :mod:`orchard.harness.editor`.
- ``finish(message?)``: ends the run. The submission is the repository's diff, which the harness
  computes, not the model: ``git diff`` against ``HEAD`` of everything in the work tree, new files
  included, built in a scratch index so the repository's own index is left as it was.

Tool calls come from the policy: ``<tool_call>`` blocks parsed by
:class:`~orchard.harness.policies.EnginePolicy`, or the server's ``tool_calls`` through
:class:`~orchard.harness.policies.OpenAIChatPolicy`. Format errors, which the core counts: a turn
with no tool call, a call that did not parse, an undefined tool, or arguments that break the tool's
schema (a missing required parameter, an unknown one, a wrong type, a command outside the enum).
A bad call rejects the whole turn: nothing of it runs, and every call of it is answered with the
error, so each ``tool_call_id`` gets its response. A valid call that fails (no match for
``old_str``, a missing file) is an ordinary observation starting with ``ERROR:``.

The calls of a turn run in order; ``finish`` ends the run at once, and calls after it are not run.
"""

from __future__ import annotations

import copy
import shlex
from dataclasses import dataclass, field
from typing import Any

from orchard.data.trajectory import Message, ToolCall, Trajectory
from orchard.env.client import AsyncSandbox
from orchard.harness.core import FormatError, Limits, Observation, Policy, Turn, run_agent
from orchard.harness.editor import COMMANDS, ToolError, str_replace_editor
from orchard.harness.shell import AGENT_ENV, clip_middle, run_shell
from orchard.harness.tools import checked_calls, reject_calls

EXECUTE_BASH = {"type": "function", "function": {
    "name": "execute_bash",
    "description": (
        "Run a bash command in the repository directory and return its output (stdout and stderr interleaved) "
        "and exit code.\n"
        "* Each call starts a new shell in the repository: `cd` and exported variables do not carry over to the "
        "next call, so chain dependent steps with `&&`.\n"
        "* Commands are killed when they exceed their timeout; do not start interactive programs or servers "
        "that never exit.\n"
        "* Long outputs are cut in the middle; print only what you need (`grep -n`, `head`, `sed -n`)."),
    "parameters": {"type": "object", "properties": {
        "command": {"type": "string", "description": "The bash command to run."},
        "timeout": {"type": "number", "description": "Seconds before the command is killed (optional; "
                                                     "capped by the harness)."},
    }, "required": ["command"]},
}}

STR_REPLACE_EDITOR = {"type": "function", "function": {
    "name": "str_replace_editor",
    "description": (
        "Custom editing tool for viewing, creating and editing plain-text files.\n"
        "* `view` on a file shows it with line numbers, as `cat -n` does; on a directory it lists the non-hidden "
        "files and directories up to 2 levels deep.\n"
        "* `create` writes a new file; it cannot overwrite an existing path.\n"
        "* `str_replace` replaces `old_str` with `new_str`. `old_str` must match EXACTLY one place in the file, "
        "whitespace included; if it matches nowhere or in several places, nothing is replaced. Include enough "
        "surrounding lines to make it unique.\n"
        "* `insert` inserts `new_str` after line `insert_line` (0 inserts at the top).\n"
        "* Long outputs are clipped and marked with `<response clipped>`."),
    "parameters": {"type": "object", "properties": {
        "command": {"type": "string", "enum": list(COMMANDS), "description": "The command to run."},
        "path": {"type": "string", "description": "Absolute path to a file or directory, e.g. "
                                                  "`/workspace/repo/file.py`."},
        "file_text": {"type": "string", "description": "`create`: the content of the new file."},
        "old_str": {"type": "string", "description": "`str_replace`: the exact text to replace."},
        "new_str": {"type": "string", "description": "`str_replace`: the replacement (empty if omitted); "
                                                     "`insert`: the text to insert."},
        "insert_line": {"type": "integer", "description": "`insert`: the line after which `new_str` goes."},
        "view_range": {"type": "array", "items": {"type": "integer"},
                       "description": "`view` of a file: [first, last] line numbers, 1-based; last -1 means "
                                      "to the end of the file."},
    }, "required": ["command", "path"]},
}}

FINISH = {"type": "function", "function": {
    "name": "finish",
    "description": "Finish the task when it is done (or when you cannot make further progress). Your changes to "
                   "the repository are submitted as they are.",
    "parameters": {"type": "object", "properties": {
        "message": {"type": "string", "description": "A short summary of what you did."},
    }, "required": []},
}}

TOOLS = [EXECUTE_BASH, STR_REPLACE_EDITOR, FINISH]

SYSTEM_PROMPT = """\
You are an autonomous software engineer. You solve tasks in a code repository by calling the tools you are \
given: `execute_bash` runs shell commands, `str_replace_editor` views, creates and edits files, and `finish` \
ends the task.

<guidelines>
* Explore before you change anything: find the relevant code and read it.
* Reproduce the problem (a failing test or a short script) before fixing it, and run it again afterwards.
* Make minimal, focused changes to the source; do not modify existing tests unless the task asks for it.
* Prefer `str_replace_editor` for edits; include enough context in `old_str` for it to match exactly once.
* Call tools for every action. When the task is done, call `finish`: your changes are submitted as they \
are, and you cannot act after that.
</guidelines>"""

TASK_TEMPLATE = """\
<uploaded_files>
{cwd}
</uploaded_files>
I've uploaded a code repository in the directory {cwd}. Consider the following task:

<task_description>
{task}
</task_description>

Make the changes to the repository's source files so that the task is done. Start by exploring the \
repository, reproduce the problem, fix it, check the fix, and then call `finish`."""

NO_TOOL_CALL = ("You did not call a tool. Work on the task by calling the tools (execute_bash, "
                "str_replace_editor); when it is done, call finish.")

def diff_command(repo: str) -> str:
    """A shell command printing the repository's changes against ``HEAD`` (or against nothing, before
    the first commit), untracked files included and Python bytecode left out, without touching the
    repository's index: ``git add -A`` goes into a scratch copy of it."""
    return (f"cd {shlex.quote(repo)} && scratch=$(mktemp) && trap 'rm -f \"$scratch\"' EXIT && "
            "{ cp \"$(git rev-parse --git-dir)/index\" \"$scratch\" 2>/dev/null || rm -f \"$scratch\"; } && "
            "base=$(git rev-parse --verify -q HEAD || git hash-object -t tree /dev/null) && "
            "GIT_INDEX_FILE=\"$scratch\" git add -A -- . ':(exclude)*__pycache__*' ':(exclude)*.pyc' && "
            "GIT_INDEX_FILE=\"$scratch\" git -c core.quotepath=off diff --cached --no-color --binary \"$base\"")


@dataclass
class CodeActHarness:
    """OpenHands-style tool calling; see the module docstring."""

    cwd: str = "/workspace/repo"
    command_timeout: float = 60.0  # default timeout of execute_bash
    max_command_timeout: float = 600.0  # the most a call's `timeout` may ask for
    output_limit: int = 30_000  # characters of a command's output shown (head and tail)
    env: dict[str, str] = field(default_factory=lambda: dict(AGENT_ENV))
    system_prompt: str = SYSTEM_PROMPT
    task_template: str = TASK_TEMPLATE  # fields: task, cwd
    name: str = "codeact"
    tools: list[dict[str, Any]] | None = field(default_factory=lambda: copy.deepcopy(TOOLS))

    def __post_init__(self) -> None:
        if not self.cwd.startswith("/"):
            raise ValueError(f"cwd must be an absolute path in the sandbox, got {self.cwd!r}")
        if not 0 < self.command_timeout <= self.max_command_timeout:
            raise ValueError("need 0 < command_timeout <= max_command_timeout")
        names = [tool["function"]["name"] for tool in self.tools or []]
        if sorted(names) != sorted(self._run_tool):
            raise ValueError(f"the codeact tools are {sorted(self._run_tool)}, got {names}")

    @property
    def _run_tool(self) -> dict[str, Any]:
        return {"execute_bash": self._bash, "str_replace_editor": self._edit, "finish": self._finish}

    def task_prompt(self, task: str) -> str:
        return self.task_template.format(task=task, cwd=self.cwd)

    def parse(self, turn: Turn) -> list[ToolCall]:
        return checked_calls(turn, self.tools or [], NO_TOOL_CALL)

    async def execute(self, call: ToolCall, sandbox: AsyncSandbox) -> Observation:
        return await self._run_tool[call.name](call, sandbox)

    async def _bash(self, call: ToolCall, sandbox: AsyncSandbox) -> Observation:
        timeout = min(float(call.arguments.get("timeout") or self.command_timeout), self.max_command_timeout)
        if timeout <= 0:
            timeout = self.command_timeout
        result = await run_shell(sandbox, call.arguments["command"], cwd=self.cwd, timeout=timeout, env=self.env)
        note = ("<response clipped><NOTE>The output was too long; only its beginning and end are shown.</NOTE>")
        output = clip_middle(result.output, self.output_limit, f"\n{note}\n")
        if output and not output.endswith("\n"):
            output += "\n"
        if result.timed_out:
            output += f"[The command timed out after {timeout:g} seconds and was killed.]"
        else:
            output += f"[The command completed with exit code {result.exit_code}.]"
        return Observation(_tool_message(call, output))

    async def _edit(self, call: ToolCall, sandbox: AsyncSandbox) -> Observation:
        try:
            text = await str_replace_editor(sandbox, **call.arguments)
        except ToolError as exc:
            text = f"ERROR:\n{exc}"
        return Observation(_tool_message(call, text))

    async def _finish(self, call: ToolCall, sandbox: AsyncSandbox) -> Observation:
        diff = await sandbox.exec(["bash", "-c", diff_command(self.cwd)], timeout=self.max_command_timeout,
                                  max_output_bytes=64 << 20)
        info: dict[str, Any] = {"finish_message": call.arguments.get("message", "")}
        if not diff.ok:
            info["diff_error"] = (diff.stderr or diff.stdout).strip()[-2000:] or f"exit code {diff.exit_code}"
        return Observation(None, submission=diff.stdout if diff.ok else "", metadata=info)

    def reject(self, turn: Turn, error: FormatError) -> list[Message]:
        return reject_calls(turn, error)

    async def run(self, task: str, policy: Policy, sandbox: AsyncSandbox, *, limits: Limits = Limits(),
                  **options: Any) -> Trajectory:
        """:func:`~orchard.harness.core.run_agent` with this harness (options: task_id, seed, metadata)."""
        return await run_agent(self, policy, sandbox, task, limits=limits, **options)


def _tool_message(call: ToolCall, text: str) -> Message:
    return Message(role="tool", content=text, tool_call_id=call.id)
