"""The synthesis loop end to end against a scripted OpenAI-compatible endpoint (a real HTTP server)."""

from __future__ import annotations

import json

from orchard.rollout.openai_client import OpenAIClient
from orchard.tasks.claw.families import FAMILIES
from orchard.tasks.claw.synthesis import SynthesisConfig, Synthesizer, json_object_in


def written(seed: int) -> dict:
    family = FAMILIES["notification_cleanup"]
    spec = family.make(family.PARAMS[0], seed)
    return {**spec.model_dump(mode="json"), "id": f"synth-{seed}", "family": "synthesized"}


def plan(steps) -> str:
    return "Here is my plan:\n```json\n" + json.dumps({"steps": steps}) + "\n```"


def test_a_json_object_is_found_in_prose_and_fences():
    assert json_object_in('Sure! ```json\n{"a": {"b": [1, 2]}}\n``` done') == {"a": {"b": [1, 2]}}
    assert json_object_in("no braces {here") is None


async def test_ideas_are_filtered_tasks_are_checked_solved_and_refined(scripted_chat):
    good, other = written(1), written(2)
    broken = {**good, "tools": [t for t in good["tools"] if t != "finish"]}
    ideas = {"ideas": [
        {"title": "Clean notifications", "workflow": "dismiss promos", "safety_rule": "keep security alerts"},
        {"title": "clean  notifications", "workflow": "again", "safety_rule": "x"},  # a duplicate
        {"title": "Delete everything", "workflow": "wipe the inbox", "safety_rule": ""},  # no safety rule
        {"title": "Hard to follow", "workflow": "vague", "safety_rule": "keep security alerts"}]}
    scripted_chat.replies.extend([
        json.dumps(ideas),
        json.dumps(broken),  # idea 1: does not load (no finish) ...
        json.dumps(good),  # ... revised: loads, passes the acceptance rule ...
        plan(good["reference_plan"]),  # ... and the solver solves it
        json.dumps(other),  # idea 2: loads and passes the rule, but the solver fails twice ...
        plan([{"tool": "finish", "arguments": {"answer": "done"}}]), "I cannot help.",
        json.dumps(other),  # ... the revision changes nothing, and the solver fails again: rejected
        plan([]), plan([{"tool": "finish", "arguments": {"answer": "done"}}]),
    ])
    author = OpenAIClient(scripted_chat.url)
    synthesizer = Synthesizer(author, "author", author, "solver", SynthesisConfig(ideas=4, max_rounds=2))
    report = await synthesizer.run(["inbox triage", "notification clean-up"])
    await author.aclose()
    assert [spec.id for spec in report.accepted] == ["synth-1"]
    assert report.dropped_ideas == {"duplicate": 1, "no safety rule": 1}
    assert list(report.rejected) == ["Hard to follow"] and "solver" in report.rejected["Hard to follow"]
    assert report.revisions == 2 and report.calls == len(scripted_chat.requests) == 10 and not scripted_chat.replies
    refine = scripted_chat.requests[2]["messages"][0]["content"]
    assert "does not load" in refine and "finish" in refine  # the author is told what was wrong
    solver_prompt = scripted_chat.requests[3]["messages"][0]["content"]
    assert good["prompt"] in solver_prompt and not any(t["code"] in solver_prompt for t in good["tests"])  # no answers
    assert scripted_chat.requests[3]["model"] == "solver" and scripted_chat.requests[0]["model"] == "author"
