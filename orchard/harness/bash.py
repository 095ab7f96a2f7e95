"""The bash harness, in mini-swe-agent's style: one shell command per turn, no tools.

The model writes its reasoning, then exactly one fenced ```` ```bash ```` block. Zero blocks or
several is a format error (told to the model, counted by the core). The command runs in a fresh
shell in the repository (``cwd``), with stdout and stderr interleaved; the model sees::

    <returncode>0</returncode>
    <output>
    ...
    </output>

and, for outputs of ``output_limit`` characters or more, a warning and only the head and tail
(``<output_head>``, ``<elided_chars>``, ``<output_tail>``), as mini-swe-agent shows them. A command
that exceeds ``command_timeout`` is killed and reported, and the run goes on.

Submission follows mini-swe-agent: a command whose output's first line is
``COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT`` ends the run, and the rest of that output is the
submission (the prompt asks for ``git add -A && git diff --cached``, so new files are included).
A submission longer than the shell's output cap (1 MiB) is cut, and a cut diff is no submission:
it is recorded as empty, with ``metadata["submission_truncated"]``.
Only the assistant's content is searched for the block, never its ``<think>`` reasoning.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from orchard.data.trajectory import Message, ToolCall, Trajectory
from orchard.env.client import AsyncSandbox
from orchard.harness.core import FormatError, Limits, Observation, Policy, Turn, run_agent
from orchard.harness.shell import AGENT_ENV, run_shell

SUBMIT_SENTINEL = "COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"
SUBMIT_COMMAND = f"echo {SUBMIT_SENTINEL} && git add -A && git diff --cached"

SYSTEM_PROMPT = """\
You are a capable software engineer who solves programming tasks by running shell commands, one at a time.

Every response has two parts:
1. A THOUGHT section: what you know so far and why you run the next command.
2. Exactly ONE bash code block holding ONE command (join several steps with && or ||).

<format_example>
THOUGHT: I should first see which files the repository contains.

```bash
ls -la
```
</format_example>

A response with no bash block, or with more than one, is rejected."""

TASK_TEMPLATE = """\
<task>
{task}
</task>

<instructions>
The repository is in {cwd}; every command starts there. Change its source files (not its tests) so that the \
task is done in a way that fits the codebase.

Work in small steps:
1. Find and read the code that matters.
2. Reproduce the problem (run the tests or a small script).
3. Edit the source: `sed -i`, or `cat <<'EOF' > file` for a whole new file.
4. Run the tests or script again to check the fix, and think about edge cases.

Rules of the environment:
- Each command runs in a new shell: `cd` and `export` do not last. Chain them: `cd sub && make`.
- Commands are killed after {timeout:g} seconds. Never start interactive programs (editors, pagers, REPLs).
- Long outputs are cut; print the lines you need with `sed -n '10,40p' file`, `head`, `tail` or `grep -n`.

When you are done, submit with this command, alone in its block:

```bash
{submit}
```

After that you cannot run anything else.
</instructions>"""

FORMAT_ERROR = """\
Your response must contain EXACTLY ONE bash code block; it contained {found}.

Answer in this form:

THOUGHT: why you run the next command.

```bash
the_command
```

When the task is done, submit with `{submit}` as the only command."""

TIMEOUT_TEMPLATE = """\
The command timed out after {timeout:g} seconds and was killed. Its output so far:
<output>
{output}</output>
Run commands that finish sooner, and never ones that wait for input."""

LONG_OUTPUT_WARNING = """\
<warning>
The output of your last command was too long. Run a command that prints less: view a file in pieces with \
sed -n or head, or narrow a grep. If you need the whole output, redirect it to a file and search that file.
</warning>"""

_BLOCK = re.compile(r"```bash\s*\n(.*?)\n```", re.DOTALL)


def _output_block(output: str) -> str:
    return f"<output>\n{output}{'' if not output or output.endswith(chr(10)) else chr(10)}</output>"


@dataclass
class BashHarness:
    """One ```` ```bash ```` block per turn, run in ``cwd``; see the module docstring."""

    cwd: str = "/workspace/repo"
    command_timeout: float = 60.0
    output_limit: int = 10_000  # characters; longer outputs show their head and tail halves
    env: dict[str, str] = field(default_factory=lambda: dict(AGENT_ENV))
    system_prompt: str = SYSTEM_PROMPT
    task_template: str = TASK_TEMPLATE  # fields: task, cwd, timeout, submit
    name: str = "bash"
    submit_command: str = SUBMIT_COMMAND  # what the prompts say ends the run (its output starts with the sentinel)
    tools: list[dict[str, Any]] | None = None

    def __post_init__(self) -> None:
        if not self.cwd.startswith("/"):
            raise ValueError(f"cwd must be an absolute path in the sandbox, got {self.cwd!r}")
        if not self.command_timeout > 0 or self.output_limit < 2:
            raise ValueError("command_timeout must be positive and output_limit at least 2 characters")
        if self.tools is not None:
            raise ValueError("the bash harness offers no tools; its action is a ```bash block")

    def task_prompt(self, task: str) -> str:
        return self.task_template.format(task=task, cwd=self.cwd, timeout=self.command_timeout,
                                         submit=self.submit_command)

    def parse(self, turn: Turn) -> list[ToolCall]:
        if turn.message.tool_calls:
            raise FormatError(FORMAT_ERROR.format(found="a tool call instead (there are no tools here)",
                                                  submit=self.submit_command))
        blocks = _BLOCK.findall(turn.message.content)
        if len(blocks) != 1:
            raise FormatError(FORMAT_ERROR.format(found=f"{len(blocks)}", submit=self.submit_command))
        command = blocks[0].strip()
        if not command:
            raise FormatError(FORMAT_ERROR.format(found="an empty one", submit=self.submit_command))
        return [ToolCall(name="bash", arguments={"command": command})]

    async def execute(self, call: ToolCall, sandbox: AsyncSandbox) -> Observation:
        result = await run_shell(sandbox, call.arguments["command"], cwd=self.cwd, timeout=self.command_timeout,
                                 env=self.env)
        if result.timed_out:
            text = TIMEOUT_TEMPLATE.format(timeout=self.command_timeout, output=self.clip(result.output))
            return Observation(Message(role="user", content=text))
        lines = result.output.lstrip().splitlines(keepends=True)
        if lines and lines[0].strip() == SUBMIT_SENTINEL:
            if result.truncated:  # a cut diff could still apply in part: it is no submission at all
                return Observation(None, submission="", metadata={"submission_truncated": True})
            return Observation(None, submission="".join(lines[1:]))
        return Observation(Message(role="user", content=self.observation(result.exit_code, result.output)))

    def observation(self, exit_code: int | None, output: str) -> str:
        """mini-swe-agent's observation: the return code, then the output or its head and tail."""
        returncode = f"<returncode>{-1 if exit_code is None else exit_code}</returncode>\n"
        if len(output) < self.output_limit:
            return returncode + _output_block(output)
        half = self.output_limit // 2
        return (f"{returncode}{LONG_OUTPUT_WARNING}\n<output_head>\n{output[:half]}\n</output_head>\n"
                f"<elided_chars>\n{len(output) - 2 * half} characters elided\n</elided_chars>\n"
                f"<output_tail>\n{output[-half:]}\n</output_tail>")

    def clip(self, output: str) -> str:
        if len(output) < self.output_limit:
            return output
        half = self.output_limit // 2
        return f"{output[:half]}\n[... {len(output) - 2 * half} characters elided ...]\n{output[-half:]}"

    def reject(self, turn: Turn, error: FormatError) -> list[Message]:
        return [Message(role="user", content=str(error))]

    async def run(self, task: str, policy: Policy, sandbox: AsyncSandbox, *, limits: Limits = Limits(),
                  **options: Any) -> Trajectory:
        """:func:`~orchard.harness.core.run_agent` with this harness (options: task_id, seed, metadata)."""
        return await run_agent(self, policy, sandbox, task, limits=limits, **options)
