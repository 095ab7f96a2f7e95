"""Shell commands as agents see them: one output stream, clipped in the middle when long.

Agents read a command's output the way a terminal shows it, stdout and stderr interleaved in the
order they were written. The sandbox keeps the two streams apart, so commands run as
``bash -c 'exec 2>&1; <command>'``: both streams share one pipe from the first line on. Each
command runs in a fresh shell (``cd`` and ``export`` do not carry over to the next), as in
mini-swe-agent.
"""

from __future__ import annotations

from dataclasses import dataclass

from orchard.env.client import AsyncSandbox

# Environment of agent commands: no pagers or progress bars (nobody can press q), no bytecode files
# (they would end up in submitted diffs).
AGENT_ENV = {"PAGER": "cat", "MANPAGER": "cat", "GIT_PAGER": "cat", "LESS": "-R", "PIP_PROGRESS_BAR": "off",
             "TQDM_DISABLE": "1", "PYTHONDONTWRITEBYTECODE": "1"}


@dataclass(frozen=True)
class ShellOutput:
    output: str  # stdout and stderr, interleaved
    exit_code: int | None  # None when the command was killed (timeout)
    timed_out: bool
    truncated: bool  # the sandbox dropped the middle of a huge output (it leaves a marker there)


async def run_shell(sandbox: AsyncSandbox, command: str, *, cwd: str | None, timeout: float,
                    env: dict[str, str] | None = None, max_output_bytes: int = 1 << 20) -> ShellOutput:
    """Run ``command`` with bash in ``sandbox``; a timeout is a result, not an exception."""
    result = await sandbox.exec(["bash", "-c", "exec 2>&1\n" + command], cwd=cwd, env=env, timeout=timeout,
                                max_output_bytes=max_output_bytes)
    return ShellOutput(output=result.stdout + result.stderr, exit_code=result.exit_code,
                       timed_out=result.timed_out, truncated=result.truncated)


def clip_middle(text: str, limit: int, note: str) -> str:
    """``text`` if it has at most ``limit`` characters, else its head and tail around ``note``."""
    if len(text) <= limit:
        return text
    half = limit // 2
    return text[:half] + note + text[len(text) - (limit - half):]
