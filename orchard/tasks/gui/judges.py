"""Orchard-GUI's judges and reward.

A judge says whether a browser episode succeeded: :class:`Verdict` ``success``, ``failure``,
``unknown`` (the judge could not tell: its API failed, its reply did not parse) or ``blocked`` (the
site stopped the agent, a "verify you are human" page: the paper's captcha-blocked runs).

* :class:`RuleJudge` is the embedded default, standing in for the paper's GPT-4.1. On MiniWoB it
  reads the page's own end of episode as the host recorded it: success when the raw reward is at
  least the task's threshold (some pages give partial credit for a wrong answer, so "positive" is
  not "right"). On the local sites it compares the final response, normalised, with the answer the
  task holds (never shown to the policy), and checks the tab state a task asks for.
* :class:`LLMJudge` asks any OpenAI-compatible endpoint, with the intent, the final response and the
  last screenshots as image parts; an API failure or an unparseable verdict is ``unknown``.

:func:`gui_reward` is the paper's reward (section 3.4): +1 when every assistant turn parsed and the
judge says success, -1 when format failures ended the episode, 0 otherwise, ``None`` (the sample is
dropped) when the judge failed, the site was blocked, or the infrastructure broke (those episodes
never reach a judge: :func:`~orchard.harness.episode.run_episode` gives them ``None``). The
notes' pseudocode gives -1 for *any* unparsable turn while the prose says *repeated* failures that
end the episode; :class:`RewardSettings` ``format_penalty`` chooses, and the default
(``"repeated"``) follows the prose: a single slip the policy recovered from costs the +1 (not every
turn parsed) but is not punished with -1.
"""

from __future__ import annotations

import base64
import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Literal

from orchard.data.trajectory import EndReason, Outcome, Trajectory
from orchard.rollout.openai_client import OpenAIClient, OpenAIError, RetryPolicy


class Verdict(StrEnum):
    SUCCESS = "success"
    FAILURE = "failure"
    UNKNOWN = "unknown"  # the judge failed: its API, or a reply that did not parse
    BLOCKED = "blocked"  # the site stopped the agent (captcha interstitial)


@dataclass(frozen=True)
class Judgement:
    verdict: Verdict
    reason: str = ""
    raw_reward: float | None = None  # MiniWoB's page reward, where there is one

    def as_metadata(self) -> dict[str, Any]:
        return {"verdict": str(self.verdict), "judge_reason": self.reason, "raw_reward": self.raw_reward}


def normalise(text: str) -> str:
    """An answer as compared: lower case, no surrounding punctuation, single spaces."""
    return re.sub(r"\s+", " ", text.strip().strip(".!\"'").lower())


class RuleJudge:
    """The rule judge (see the module docstring)."""

    name = "rule"

    def judge_episode(self, events: Sequence[dict[str, Any]], threshold: float = 1.0) -> Judgement:
        """A MiniWoB episode, from the events its page reported to the host."""
        if any(event.get("type") == "blocked" for event in events):
            return Judgement(Verdict.BLOCKED, "the site showed a human-verification page")
        end = next((event for event in events if event.get("type") == "episode_end"), None)
        if end is None:
            return Judgement(Verdict.FAILURE, "the page never ended its episode")
        raw = float(end["raw_reward"])
        verdict = Verdict.SUCCESS if raw >= threshold else Verdict.FAILURE
        return Judgement(verdict, f"raw reward {raw:g} against threshold {threshold:g}", raw)

    def judge_answer(self, events: Sequence[dict[str, Any]], response: str | None, expected: str,
                     open_tabs: int | None = None, tabs_expected: int | None = None) -> Judgement:
        """A local-site episode: the final response against the task's answer (and the tab count)."""
        if any(event.get("type") == "blocked" for event in events):
            return Judgement(Verdict.BLOCKED, "the site showed a human-verification page")
        if response is None:
            return Judgement(Verdict.FAILURE, "no final response (done was never called)")
        if normalise(response) != normalise(expected):
            return Judgement(Verdict.FAILURE, f"the response {response!r} is not the answer")
        if tabs_expected is not None and open_tabs != tabs_expected:
            return Judgement(Verdict.FAILURE, f"{open_tabs} tabs open, the task asked for {tabs_expected}")
        return Judgement(Verdict.SUCCESS, "the response is the answer")


LLM_JUDGE_PROMPT = """You are judging whether a web agent completed a task in a browser.

Task: {intent}
The agent's final response: {response}

The last screenshots of the browser follow, oldest first. Decide from the task, the response and \
the screenshots whether the task was completed. Reply with only a JSON object: \
{{"verdict": "success" | "failure", "reason": "<one sentence>"}}"""


@dataclass
class LLMJudge:
    """A success judge over an OpenAI-compatible ``/v1/chat/completions`` (``base_url`` ends in /v1's parent)."""

    base_url: str
    model: str
    api_key: str = "EMPTY"
    timeout: float = 120.0
    max_retries: int = 2
    name: str = "llm"

    def __post_init__(self) -> None:
        self.client = OpenAIClient(self.base_url, self.api_key, timeout=self.timeout,
                                   retry=RetryPolicy(max_retries=self.max_retries))

    def request(self, intent: str, response: str | None, screenshots: Sequence[bytes]) -> dict[str, Any]:
        parts: list[dict[str, Any]] = [{"type": "text", "text": LLM_JUDGE_PROMPT.format(
            intent=intent, response=response if response is not None else "(none)")}]
        parts += [{"type": "image_url", "image_url": {"url": "data:image/png;base64," + base64.b64encode(png).decode()}}
                  for png in screenshots]
        return {"model": self.model, "messages": [{"role": "user", "content": parts}], "temperature": 0.0,
                "max_tokens": 256}

    async def judge(self, intent: str, response: str | None, screenshots: Sequence[bytes]) -> Judgement:
        try:
            reply = await self.client.apost("/v1/chat/completions", self.request(intent, response, screenshots))
            text = reply["choices"][0]["message"]["content"] or ""
        except (OpenAIError, KeyError, IndexError, TypeError) as exc:
            return Judgement(Verdict.UNKNOWN, f"the judge's API failed: {exc}")
        return parse_verdict(text)

    async def aclose(self) -> None:
        await self.client.aclose()


def parse_verdict(text: str) -> Judgement:
    """The verdict in a judge's reply (a JSON object, possibly in prose or a code fence); ``unknown``
    when there is none."""
    for match in re.finditer(r"\{[^{}]*\}", text):
        try:
            value = json.loads(match.group(0))
        except json.JSONDecodeError:
            continue
        verdict = str(value.get("verdict", "")).strip().lower() if isinstance(value, dict) else ""
        if verdict in ("success", "failure"):
            return Judgement(Verdict(verdict), str(value.get("reason", "")))
    return Judgement(Verdict.UNKNOWN, f"no verdict in the judge's reply: {text[:200]!r}")


@dataclass(frozen=True)
class RewardSettings:
    """``format_penalty``: ``"repeated"`` (the prose, the default: -1 only when format failures end
    the episode) or ``"any"`` (the notes' pseudocode: -1 for any unparsable turn)."""

    format_penalty: Literal["repeated", "any"] = "repeated"


def gui_reward(trajectory: Trajectory, judgement: Judgement, settings: RewardSettings = RewardSettings()) -> float | None:
    """The paper's GUI reward of a graded episode (see the module docstring)."""
    format_errors = int(trajectory.metadata.get("format_errors", 0))
    if trajectory.end_reason == EndReason.FORMAT_ERRORS:
        return -1.0
    if settings.format_penalty == "any" and format_errors > 0:
        return -1.0
    if judgement.verdict in (Verdict.UNKNOWN, Verdict.BLOCKED):
        return None
    if judgement.verdict == Verdict.SUCCESS and format_errors == 0:
        return 1.0
    return 0.0


def gui_outcome(trajectory: Trajectory, judgement: Judgement, settings: RewardSettings = RewardSettings()) -> Outcome:
    """The outcome of a graded episode: the paper's reward, and ``resolved`` when the judge says
    success. The judgement is recorded in the trajectory's metadata."""
    trajectory.metadata.update(judgement.as_metadata())
    return Outcome(reward=gui_reward(trajectory, judgement, settings), resolved=judgement.verdict == Verdict.SUCCESS)
