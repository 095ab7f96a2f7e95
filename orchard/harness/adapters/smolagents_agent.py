"""smolagents' ``CodeAgent`` as an external harness: its own loop, its own prompts, in its own process.

smolagents (``pip install smolagents``; written against 1.26.0) is Hugging Face's agent library: a
``CodeAgent`` asks its model for Python in ``<code>`` blocks, runs it in its own restricted
interpreter, and shows the model what it printed. Orchard gives it one tool, ``bash(command)``,
which runs the command in the task's Orchard sandbox (through the SDK, as any process beside a
sandbox may) and returns its output; its model is smolagents' ``OpenAIModel`` pointed at the
recording proxy's session. Everything else (the system prompt, parsing, retries on a malformed
reply, the step budget and the final answer) is smolagents' own.

:func:`smolagents_harness` describes it for :mod:`orchard.harness.adapters.external`; this module
is also the process it runs:

.. code-block:: console

    python -m orchard.harness.adapters.smolagents_agent --task-file task.txt --max-steps 4
    # with OPENAI_BASE_URL, OPENAI_API_KEY, ORCHARD_URL, ORCHARD_API_KEY and ORCHARD_SANDBOX_ID set

It exits 0 when the agent's run ends (a final answer, or smolagents' own answer at its step limit,
whose state it writes to ``$ORCHARD_OUTPUT_DIR/result.json``), and non-zero when smolagents raises.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Awaitable, Callable

from orchard.env.client import AsyncSandbox, Sandbox
from orchard.harness.adapters.external import ExternalHarness
from orchard.harness.core import DEFAULT_MAX_TURNS

HARNESS = "smolagents"
COMMAND_TIMEOUT_S = 60
OUTPUT_CHARS = 8000  # of a command's output shown to the model (its head and tail)


def smolagents_harness(max_turns: int = DEFAULT_MAX_TURNS, submission: Callable[[AsyncSandbox], Awaitable[str]] | None = None,
                       wall_clock_s: float = 600.0, max_tokens: int | None = None, cwd: str | None = None,
                       task_template: str = "{task}") -> ExternalHarness:
    """smolagents' ``CodeAgent`` run by :mod:`orchard.harness.adapters.external`; its ``bash`` runs in
    ``cwd`` (default: the sandbox's workdir); its task is ``task_template`` around the task's prompt."""
    command = [sys.executable, "-m", "orchard.harness.adapters.smolagents_agent", "--task-file", "{task_file}",
               "--max-steps", str(max_turns)]
    if cwd is not None:
        command += ["--cwd", cwd]
    if max_tokens is not None:
        command += ["--max-tokens", str(max_tokens)]
    return ExternalHarness(HARNESS, command, submission, wall_clock_s=wall_clock_s, task_template=task_template)


def _clip(text: str) -> str:
    if len(text) <= OUTPUT_CHARS:
        return text
    half = OUTPUT_CHARS // 2
    return f"{text[:half]}\n[... {len(text) - OUTPUT_CHARS} characters cut ...]\n{text[-half:]}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="smolagents' CodeAgent on an Orchard sandbox")
    parser.add_argument("--task-file", required=True)
    parser.add_argument("--max-steps", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=None)
    parser.add_argument("--model", default="orchard")
    parser.add_argument("--cwd", default=None, help="where commands run (default: the sandbox's workdir)")
    args = parser.parse_args(argv)

    from orchard.env.client import SandboxClient

    with SandboxClient(os.environ["ORCHARD_URL"], os.environ.get("ORCHARD_API_KEY")) as client:
        result = _run(client.get(os.environ["ORCHARD_SANDBOX_ID"]), args)
    out = os.environ.get("ORCHARD_OUTPUT_DIR")
    if out:
        with open(os.path.join(out, "result.json"), "w") as handle:
            json.dump({"state": result.state, "output": str(result.output)}, handle)
    return 0


def _run(sandbox: Sandbox, args: argparse.Namespace):
    """The agent's run, as smolagents returns it (``RunResult``)."""
    from smolagents import CodeAgent, OpenAIModel, Tool

    class Bash(Tool):
        name = "bash"
        description = ("Runs a bash command in the task's machine (the repository is the working directory) "
                       "and returns its exit status and output.")
        inputs = {"command": {"type": "string", "description": "the bash command to run"}}
        output_type = "string"

        def forward(self, command: str) -> str:
            result = sandbox.exec(["bash", "-c", command], cwd=args.cwd, timeout=COMMAND_TIMEOUT_S)
            status = "timed out" if result.timed_out else f"exit status {result.exit_code}"
            return f"{status}\n{_clip(result.stdout + result.stderr)}"

    options = {"max_tokens": args.max_tokens} if args.max_tokens else {}
    model = OpenAIModel(args.model, api_base=os.environ["OPENAI_BASE_URL"], api_key=os.environ["OPENAI_API_KEY"],
                        client_kwargs={"max_retries": 0}, **options)
    agent = CodeAgent(tools=[Bash()], model=model, max_steps=args.max_steps, verbosity_level=0)
    with open(args.task_file) as handle:
        return agent.run(handle.read(), return_full_result=True)


if __name__ == "__main__":
    sys.exit(main())
