"""Credit assignment for unresolved trajectories: per-step values and rise segments.

Orchard-SWE (section 3.3 of the paper notes) asks a teacher, who knows the final test result, for
``V(s_t) = P(resolve | h_t, outcome)`` at every state of a trajectory ``s_0, a_0, s_1, ..., s_T``.
The credit of action ``a_t`` is ``c_t = V(s_{t+1}) - V(s_t)``, and a **rise segment** is a maximal
run of consecutive actions whose credit is at least ``epsilon`` (0.05 in the paper).

Segments are inclusive ranges of **action indices**: ``(i, j)`` covers actions ``a_i .. a_j``, the
``i``-th to ``j``-th assistant messages, counted from 0. Action ``a_t`` is the step from
``V(s_t)`` to ``V(s_{t+1})``, so ``values`` has one more entry than there are actions.

Estimators (:class:`ValueEstimator`):

- :class:`LLMJudge` asks any OpenAI-compatible endpoint, showing it the whole trajectory and the
  final test result; replies are parsed leniently, retried with the parse error, and cached.
- :class:`BugLocationEstimator` is a rule-based estimator for synthetic tasks whose ground truth (the
  buggy file and line) is known. It is a stand-in for a teacher, not the paper's method: it scores
  observable milestones (opened the file, saw the line, edited the file) and ends at the outcome.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import httpx

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


def _steps(trajectory: Trajectory) -> list[tuple[str, str]]:
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


JUDGE_INSTRUCTIONS = """You are grading an agent's attempt at a software task, step by step, after the fact.
You know how it ended. For every state of the trajectory, estimate the probability (0 to 1) that an
agent continuing from that state would resolve the task: state 0 is before the first action, state k
is right after action k. There are {states} states (0..{last}).
Reply with only a JSON object: {{"values": [v0, v1, ..., v{last}]}}."""


@dataclass
class LLMJudge:
    """Per-step P(resolve) from a judge model behind an OpenAI-compatible ``/v1/chat/completions``.

    The reply may wrap the JSON in prose or a code fence; the first object with a ``values`` list
    (or a bare list) is used. A reply with the wrong count or a value outside [0, 1] is retried, up
    to ``retries`` times, telling the judge what was wrong. Answers are cached on disk by a hash of
    the model and the prompt, so re-running a data build costs nothing.
    """

    base_url: str
    model: str
    api_key: str = "EMPTY"
    cache_dir: str | None = None
    retries: int = 3
    max_observation_chars: int = 2000
    timeout: float = 300.0

    def prompt(self, trajectory: Trajectory) -> str:
        task = next((m.content for m in trajectory.messages if m.role == "user"), "")
        lines = [f"# Task\n{task}", "# Trajectory"]
        for index, (action, observation) in enumerate(_steps(trajectory), start=1):
            if len(observation) > self.max_observation_chars:
                half = self.max_observation_chars // 2
                observation = f"{observation[:half]}\n[... {len(observation) - 2 * half} chars ...]\n{observation[-half:]}"
            lines.append(f"## Action {index}\n{action}\n## Observation {index}\n{observation}")
        outcome = trajectory.outcome
        lines.append(f"# Final result\nresolved: {outcome.resolved}, status: {outcome.status}, "
                     f"reward: {outcome.reward}")
        return "\n\n".join(lines)

    def estimate(self, trajectory: Trajectory) -> list[float]:
        states = trajectory.num_actions + 1
        system = JUDGE_INSTRUCTIONS.format(states=states, last=states - 1)
        messages = [{"role": "system", "content": system}, {"role": "user", "content": self.prompt(trajectory)}]
        key = hashlib.sha256(json.dumps([self.model, messages]).encode()).hexdigest()
        if (cached := self._cache_get(key)) is not None:
            return cached
        problem = ""
        with httpx.Client(timeout=self.timeout, headers={"Authorization": f"Bearer {self.api_key}"}) as http:
            for attempt in range(self.retries + 1):
                turn = messages if not problem else [*messages, {"role": "user", "content": problem}]
                reply = self._ask(http, turn, attempt)
                try:
                    values = parse_values(reply, states)
                except ValueError as exc:
                    problem = f"Your reply could not be used: {exc}. Reply with only the JSON object."
                    continue
                self._cache_put(key, values)
                return values
        raise ValueError(f"the judge gave no usable values after {self.retries + 1} attempts: {problem}")

    def _ask(self, http: httpx.Client, messages: list[dict], attempt: int) -> str:
        """One judge reply; connection errors, 429 and 5xx are retried with backoff."""
        body = {"model": self.model, "messages": messages, "temperature": 0.0 if attempt == 0 else 0.7}
        url = f"{self.base_url.rstrip('/')}/chat/completions"
        for delay in (0.5, 1.0, 2.0, None):
            try:
                response = http.post(url, json=body)
            except httpx.TransportError:
                if delay is None:
                    raise
            else:
                if delay is None or (response.status_code != 429 and response.status_code < 500):
                    response.raise_for_status()
                    return response.json()["choices"][0]["message"]["content"] or ""
            time.sleep(delay)
        raise AssertionError("unreachable")

    def _cache_path(self, key: str) -> str | None:
        return os.path.join(self.cache_dir, f"{key}.json") if self.cache_dir else None

    def _cache_get(self, key: str) -> list[float] | None:
        path = self._cache_path(key)
        if path and os.path.exists(path):
            with open(path) as handle:
                return json.load(handle)
        return None

    def _cache_put(self, key: str, values: list[float]) -> None:
        if path := self._cache_path(key):
            os.makedirs(self.cache_dir, exist_ok=True)
            with open(path + ".tmp", "w") as handle:
                json.dump(values, handle)
            os.replace(path + ".tmp", path)


_FENCE = re.compile(r"```(?:json)?\s*(.*?)```", re.DOTALL)


def parse_values(reply: str, states: int) -> list[float]:
    """The judge's values from free text: a ``{"values": [...]}`` object or a bare list, possibly in a
    code fence or surrounded by prose. Raises ``ValueError`` saying what is wrong."""
    candidates = [*_FENCE.findall(reply), reply]
    found = None
    for text in candidates:
        decoder = json.JSONDecoder()
        for start, char in enumerate(text):
            if char not in "[{":
                continue
            try:
                value, _ = decoder.raw_decode(text, start)
            except json.JSONDecodeError:
                continue
            if isinstance(value, dict) and isinstance(value.get("values"), list):
                found = value["values"]
            elif isinstance(value, list):
                found = value
            if found is not None:
                break
        if found is not None:
            break
    if found is None:
        raise ValueError("no JSON list of values found")
    if len(found) != states:
        raise ValueError(f"expected {states} values (one per state), got {len(found)}")
    try:
        values = [float(v) for v in found]
    except (TypeError, ValueError) as exc:
        raise ValueError(f"values must be numbers: {exc}") from exc
    if any(not 0.0 <= v <= 1.0 for v in values):
        raise ValueError("values must be probabilities in [0, 1]")
    return values


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
        for action, observation in _steps(trajectory):
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
