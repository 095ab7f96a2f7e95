"""The GUI judges and the paper's reward: the rule judge's thresholds, the reward table with both
format-penalty settings, and the LLM judge against a scripted OpenAI-compatible server on loopback."""

from __future__ import annotations

import base64
import json

import pytest

from orchard.data.trajectory import EndReason, Message, Trajectory
from orchard.tasks.gui.judges import (
    Judgement,
    LLMJudge,
    RewardSettings,
    RuleJudge,
    Verdict,
    gui_reward,
    parse_verdict,
)


def ended(raw: float) -> list[dict]:
    return [{"type": "episode_end", "ends_episode": True, "raw_reward": raw, "reward": raw * 0.8}]


def test_the_rule_judge_needs_the_threshold_not_a_positive_reward():
    judge = RuleJudge()
    assert judge.judge_episode(ended(1.0)).verdict == Verdict.SUCCESS
    partial = judge.judge_episode(ended(0.1))  # find-greatest's partial credit for a wrong card
    assert partial.verdict == Verdict.FAILURE and partial.raw_reward == 0.1
    assert judge.judge_episode(ended(0.1), threshold=0.1).verdict == Verdict.SUCCESS
    assert judge.judge_episode(ended(-1.0)).verdict == Verdict.FAILURE
    assert judge.judge_episode([]).reason == "the page never ended its episode"
    assert judge.judge_episode([{"type": "blocked"}, *ended(1.0)]).verdict == Verdict.BLOCKED


def test_the_rule_judge_compares_answers_and_tabs():
    judge = RuleJudge()
    assert judge.judge_answer([], " $12.50. ", "$12.50").verdict == Verdict.SUCCESS
    assert judge.judge_answer([], "Copper  kettle", "Copper Kettle").verdict == Verdict.SUCCESS
    assert judge.judge_answer([], "$12.5", "$12.50").verdict == Verdict.FAILURE
    assert judge.judge_answer([], None, "x").verdict == Verdict.FAILURE
    assert judge.judge_answer([], "x", "x", open_tabs=3, tabs_expected=1).verdict == Verdict.FAILURE
    assert judge.judge_answer([{"type": "blocked"}], "x", "x").verdict == Verdict.BLOCKED


def trajectory(end: EndReason, format_errors: int = 0) -> Trajectory:
    return Trajectory(task_id="t", messages=[Message(role="user", content="do it")],
                      metadata={"end_reason": end, "format_errors": format_errors})


@pytest.mark.parametrize(("end", "errors", "verdict", "repeated", "any_"), [
    (EndReason.SUBMITTED, 0, Verdict.SUCCESS, 1.0, 1.0),
    (EndReason.SUBMITTED, 1, Verdict.SUCCESS, 0.0, -1.0),  # a slip it recovered from: not every turn parsed
    (EndReason.SUBMITTED, 0, Verdict.FAILURE, 0.0, 0.0),
    (EndReason.STEP_LIMIT, 0, Verdict.FAILURE, 0.0, 0.0),
    (EndReason.FORMAT_ERRORS, 3, Verdict.FAILURE, -1.0, -1.0),  # repeated failures ended the episode
    (EndReason.FORMAT_ERRORS, 3, Verdict.SUCCESS, -1.0, -1.0),
    (EndReason.SUBMITTED, 0, Verdict.UNKNOWN, None, None),  # the judge failed: the sample is dropped
    (EndReason.SUBMITTED, 0, Verdict.BLOCKED, None, None),  # captcha-blocked
    (EndReason.SUBMITTED, 1, Verdict.BLOCKED, None, -1.0),
])
def test_the_reward_table(end, errors, verdict, repeated, any_):
    run = trajectory(end, errors)
    assert gui_reward(run, Judgement(verdict)) == repeated  # the default follows the paper's prose
    assert gui_reward(run, Judgement(verdict), RewardSettings(format_penalty="any")) == any_


def test_verdicts_are_parsed_leniently_and_unknown_otherwise():
    assert parse_verdict('```json\n{"verdict": "Success", "reason": "ok"}\n```').verdict == Verdict.SUCCESS
    assert parse_verdict('I think {"verdict": "failure"}').verdict == Verdict.FAILURE
    assert parse_verdict("It worked!").verdict == Verdict.UNKNOWN
    assert parse_verdict('{"verdict": "maybe"}').verdict == Verdict.UNKNOWN


async def test_the_llm_judge_sees_the_intent_response_and_screenshots(scripted_chat):
    replies, requests = scripted_chat.replies, scripted_chat.requests
    judge = LLMJudge(scripted_chat.url, "judge-model", max_retries=1)
    png = base64.b64decode("iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAEhQGAhKmMIQAAAABJRU5ErkJggg==")
    replies += [json.dumps({"verdict": "success", "reason": "the price is right"}), "no idea", 500, 500]
    try:
        verdict = await judge.judge("Find the price", "$12.50", [png, png])
        assert verdict.verdict == Verdict.SUCCESS and verdict.reason == "the price is right"
        parts = requests[0]["messages"][0]["content"]
        assert "Find the price" in parts[0]["text"] and "$12.50" in parts[0]["text"]
        assert [p["type"] for p in parts] == ["text", "image_url", "image_url"]
        assert parts[1]["image_url"]["url"] == "data:image/png;base64," + base64.b64encode(png).decode()
        assert (await judge.judge("Find the price", None, [])).verdict == Verdict.UNKNOWN  # unparseable
        failed = await judge.judge("Find the price", "x", [])  # 500, retried once, 500 again
        assert failed.verdict == Verdict.UNKNOWN and "API failed" in failed.reason
        assert len(requests) == 4
    finally:
        await judge.aclose()
