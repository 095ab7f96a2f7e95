"""Credit assignment for unresolved trajectories: per-step values and rise segments.

Orchard-SWE (section 3.3 of the paper notes) asks a teacher, who knows the final test result, for
``V(s_t) = P(resolve | h_t, outcome)`` at every state of a trajectory ``s_0, a_0, s_1, ..., s_T``.
The credit of action ``a_t`` is ``c_t = V(s_{t+1}) - V(s_t)``, and a **rise segment** is a maximal
run of consecutive actions whose credit is at least ``epsilon`` (0.05 in the paper).

Segments are inclusive ranges of **action indices**: ``(i, j)`` covers actions ``a_i .. a_j``, the
``i``-th to ``j``-th assistant messages, counted from 0. Action ``a_t`` is the step from
``V(s_t)`` to ``V(s_{t+1})``, so ``values`` has one more entry than there are actions.

Estimators (:class:`ValueEstimator`):

- :class:`~orchard.eval.judge.LLMJudge` asks any OpenAI-compatible endpoint, showing it the whole
  trajectory and the final test result; replies are parsed leniently, retried with the parse
  error, and cached.
- :class:`BugLocationEstimator` is a rule-based estimator for synthetic tasks whose ground truth (the
  buggy file and line) is known. It is a stand-in for a teacher, not the paper's method: it scores
  observable milestones (opened the file, saw the line, edited the file) and ends at the outcome.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from orchard.data.trajectory import Trajectory

EPSILON = 0.05
TOLERANCE = 1e-9  # 0.30 - 0.25 is 0.04999999999999999 in binary; a credit written as epsilon counts


def rise_segments(values: Sequence[float], epsilon: float = EPSILON) -> list[tuple[int, int]]:
    """Maximal runs of actions ``t`` with ``values[t + 1] - values[t] >= epsilon``, as inclusive
    ``(first, last)`` action indices. A credit short of ``epsilon`` by rounding alone (``TOLERANCE``)
    counts as reaching it."""
    segments: list[tuple[int, int]] = []
    start = None
    for t in range(len(values) - 1):
        if values[t + 1] - values[t] >= epsilon - TOLERANCE:
            start = t if start is None else start
        elif start is not None:
            segments.append((start, t - 1))
            start = None
    if start is not None:
        segments.append((start, len(values) - 2))
    return segments


class ValueEstimator(Protocol):
    def estimate(self, trajectory: Trajectory) -> list[float]:
        """``V(s_0) .. V(s_T)``: one value per state, ``trajectory.num_actions + 1`` in all."""
        ...


def annotate(trajectory: Trajectory, estimator: ValueEstimator, epsilon: float = EPSILON) -> Trajectory:
    """A copy of ``trajectory`` with its values and rise segments filled in."""
    values = estimator.estimate(trajectory)
    return trajectory.model_copy(update={"values": values, "rise_segments": rise_segments(values, epsilon)})


def action_steps(trajectory: Trajectory) -> list[tuple[str, str]]:
    """(action text, observation text that followed it) per action."""
    steps: list[tuple[str, str]] = []
    for message in trajectory.messages:
        if message.role == "assistant":
            calls = "".join(f"\n[call {c.name} {json.dumps(c.arguments) if not isinstance(c.arguments, str) else c.arguments}]"
                            for c in message.tool_calls)
            steps.append((message.content + calls, ""))
        elif steps and message.role in ("tool", "user"):
            action, seen = steps[-1]
            steps[-1] = (action, seen + message.content)
    return steps


@dataclass
class BugLocationEstimator:
    """Rule-based values for synthetic bug-fix tasks whose buggy file and line are known.

    Milestones, each reached once and never lost: the agent's actions or observations mention the
    file (``found_file``), an observation shows the buggy line as it reads in the buggy file
    (``saw_line``), an action edits the file at that line, naming its number or its text
    (``edited``). ``V`` starts at ``start`` and adds each milestone's weight; the final state is
    the outcome (1 if resolved, else 0), as ``V(s_T) = P(resolve | h_T, outcome)`` requires.
    """

    buggy_file: str
    buggy_line: str
    line_number: int | None = None
    start: float = 0.1
    found_file: float = 0.2
    saw_line: float = 0.2
    edited: float = 0.3

    EDIT = re.compile(r"sed\s+-i|apply_patch|git\s+apply|\bpatch\b|>\s*\S|str_replace|write_file|edit_file")

    def estimate(self, trajectory: Trajectory) -> list[float]:
        name = os.path.basename(self.buggy_file)
        reached: set[str] = set()
        values = [self.start]
        for action, observation in action_steps(trajectory):
            if name in action or name in observation:
                reached.add("found_file")
            if self.buggy_line.strip() and self.buggy_line.strip() in observation:
                reached.add("saw_line")
            at_line = self.buggy_line.strip() in action or (
                self.line_number is not None and re.search(rf"(?<!\d){self.line_number}(?!\d)", action))
            if name in action and self.EDIT.search(action) and at_line:
                reached.add("edited")
            values.append(min(1.0, self.start + sum(getattr(self, m) for m in reached)))
        values[-1] = 1.0 if trajectory.outcome.resolved else 0.0
        return values
