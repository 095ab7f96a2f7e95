"""Synthetic bug-fix tasks over real Python source, with scripted teacher trajectories.

A task takes a real module (the standard library by default), picks a line with a binary
comparison or arithmetic operator inside a function, and flips the operator: the buggy file and
line are known, which is what :class:`~orchard.data.rise.BugLocationEstimator` needs.

:func:`teacher_trajectory` scripts what a competent agent does (list, search, read, edit, test) in
the bash tool-calling format. Observations are computed from the real file contents in Python,
not by running the commands in a sandbox; the test result is decided by whether the scripted edit
restores the original line. Half the trajectories edit the wrong line and fail, so the data has
unresolved trajectories whose rise segments cover only the localisation steps.

This is the embedded default data of ``configs/swe_sft.py:tiny``: small, real text, no downloads.
Real SWE task sources (SWE-bench-style repositories in sandboxes) replace it at scale.
"""

from __future__ import annotations

import ast
import os
import sysconfig
from dataclasses import dataclass

from orchard.data.trajectory import Message, Outcome, ToolCall, Trajectory
from orchard.seeds import seeded_random

FLIPS = {" < ": " <= ", " > ": " >= ", " <= ": " < ", " >= ": " > ", " == ": " != ", " != ": " == ",
         " + ": " - ", " - ": " + "}
BASH_TOOL = {"type": "function", "function": {
    "name": "bash", "description": "Run a bash command in the repository and return its output.",
    "parameters": {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}}}
SYSTEM = "You are a software engineer. Fix the bug described by the user. Use the bash tool."


@dataclass(frozen=True)
class BugTask:
    task_id: str
    path: str  # relative to the repository root
    function: str
    line_number: int  # 1-based
    original: str
    buggy: str
    source: str  # the whole buggy file


def _candidates(text: str) -> list[tuple[str, int]]:
    """(function name, 1-based line) of lines inside functions that hold a flippable operator."""
    try:
        tree = ast.parse(text)
    except SyntaxError:
        return []
    lines = text.splitlines()
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef) and node.end_lineno:
            for number in range(node.lineno + 1, node.end_lineno + 1):
                line = lines[number - 1]
                if not line.lstrip().startswith("#") and any(op in line for op in FLIPS) and len(line) < 100:
                    found.append((node.name, number))
    return found


def make_tasks(count: int, seed: int = 0, root: str | None = None) -> list[BugTask]:
    """``count`` tasks from the Python files under ``root`` (default: the standard library)."""
    root = root or sysconfig.get_paths()["stdlib"]
    files = sorted(os.path.join(root, name) for name in os.listdir(root) if name.endswith(".py"))
    rng = seeded_random(seed, "synthetic-tasks")
    rng.shuffle(files)
    tasks: list[BugTask] = []
    for path in files:
        with open(path, encoding="utf-8", errors="replace") as handle:
            text = handle.read()
        candidates = _candidates(text)
        if not candidates:
            continue
        function, number = rng.choice(candidates)
        lines = text.splitlines()
        original = lines[number - 1]
        op = next(op for op in FLIPS if op in original)
        lines[number - 1] = original.replace(op, FLIPS[op], 1)
        name = os.path.basename(path)
        tasks.append(BugTask(f"{name}:{function}:{number}", name, function, number, original, lines[number - 1],
                             "\n".join(lines) + "\n"))
        if len(tasks) == count:
            break
    return tasks


def _call(step: int, thought: str, command: str) -> list[Message]:
    return [Message(role="assistant", content=thought,
                    tool_calls=[ToolCall(id=f"call_{step}", name="bash", arguments={"command": command})])]


def teacher_trajectory(task: BugTask, resolved: bool) -> Trajectory:
    """The scripted rollout; with ``resolved=False`` the edit goes to a wrong line and the tests fail."""
    lines = task.source.splitlines()
    first = max(1, task.line_number - 3)
    window = "\n".join(f"{n}\t{lines[n - 1]}" for n in range(first, min(len(lines), task.line_number + 3) + 1))
    grep = "\n".join(f"{n}:{line}" for n, line in enumerate(lines, 1) if f"def {task.function}" in line)
    target = task.line_number if resolved else (first if first != task.line_number else first + 1)
    wrong = lines[target - 1]
    steps = [
        ("Let me look at the repository.", "ls", f"{task.path}\ntests/"),
        (f"The failure is in `{task.function}`; let me find it.", f"grep -n 'def {task.function}' {task.path}", grep),
        ("Let me read the code around it.", f"sed -n '{first},{task.line_number + 3}p' {task.path}", window),
    ]
    if resolved:
        fix = f"sed -i '{task.line_number}s/.*/{task.original.strip()}/' {task.path}"
        steps.append((f"Line {task.line_number} uses the wrong operator. Fixing it.", fix, ""))
        steps.append(("Now run the tests.", "python -m pytest -q tests", "1 passed"))
    else:
        steps.append((f"Line {target} looks suspicious. Changing it.", f"sed -i '{target}s/.*/{wrong.strip()}  # fixed/' "
                      f"{task.path}", ""))
        steps.append(("Now run the tests.", "python -m pytest -q tests", f"1 failed: {task.function} is wrong"))
    messages = [Message(role="system", content=SYSTEM),
                Message(role="user", content=f"The tests of `{task.function}` in {task.path} fail. Fix the bug.")]
    for step, (thought, command, observation) in enumerate(steps):
        messages += _call(step, thought, command)
        messages.append(Message(role="tool", content=observation, tool_call_id=f"call_{step}"))
    messages.append(Message(role="assistant", content="The tests pass." if resolved else "I could not fix it."))
    return Trajectory(task_id=task.task_id, harness="scripted-teacher", policy="scripted", messages=messages,
                      tools=[BASH_TOOL], outcome=Outcome(reward=float(resolved), resolved=resolved))
