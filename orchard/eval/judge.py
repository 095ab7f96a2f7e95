"""LLM judges: models behind an OpenAI-compatible endpoint that grade what an agent did.

:class:`LLMJudge` is Orchard-SWE's retrospective value estimator (a
:class:`~orchard.data.rise.ValueEstimator`): shown a whole trajectory and how it ended, it gives
``V(s_t) = P(resolve | h_t, outcome)`` for every state, from which
:func:`~orchard.data.rise.rise_segments` finds the steps that made progress. Its replies are parsed
leniently (:func:`parse_values`), a reply that cannot be used is asked again with what was wrong,
requests retry through :class:`~orchard.rollout.openai_client.OpenAIClient`, and answers are cached
on disk by a hash of the model and the prompt, so re-running a data build costs nothing.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from dataclasses import dataclass

from orchard.data.rise import action_steps
from orchard.data.trajectory import Trajectory
from orchard.rollout.openai_client import OpenAIClient

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
    max_tokens: int | None = None  # a cap on each reply (None: the server's default)

    def prompt(self, trajectory: Trajectory) -> str:
        task = next((m.content for m in trajectory.messages if m.role == "user"), "")
        lines = [f"# Task\n{task}", "# Trajectory"]
        for index, (action, observation) in enumerate(action_steps(trajectory), start=1):
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
        client = OpenAIClient(self.base_url, self.api_key, timeout=self.timeout)
        try:
            for attempt in range(self.retries + 1):
                turn = messages if not problem else [*messages, {"role": "user", "content": problem}]
                body = {"model": self.model, "messages": turn, "temperature": 0.0 if attempt == 0 else 0.7,
                        **({"max_tokens": self.max_tokens} if self.max_tokens else {})}
                reply = client.post("/v1/chat/completions", body)["choices"][0]["message"]["content"] or ""
                try:
                    values = parse_values(reply, states)
                except ValueError as exc:
                    problem = f"Your reply could not be used: {exc}. Reply with only the JSON object."
                    continue
                self._cache_put(key, values)
                return values
        finally:
            client.close()
        raise ValueError(f"the judge gave no usable values after {self.retries + 1} attempts: {problem}")

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
