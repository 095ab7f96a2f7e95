"""The Claw harness's HTTP binding of tool calls and what the model reads of a reply (episodes in
real sandboxes are in tests/tasks/claw/test_task.py)."""

from __future__ import annotations

import pytest

from orchard.data.trajectory import Message
from orchard.harness.claw import (
    MAX_ANSWER_CHARS,
    claw_shell_harness,
    claw_smolagents_harness,
    http_request_for,
    tool_answer,
)
from orchard.harness.core import FormatError, Turn


def test_path_parameters_are_filled_and_the_rest_goes_to_the_query_or_the_body():
    move = {"method": "POST", "path": "/mail/messages/{id}/move"}
    assert http_request_for(move, {"id": "m 1/x", "folder": "archive"}) == (
        "POST", "/mail/messages/m%201%2Fx/move", {}, {"folder": "archive"})
    listing = {"method": "get", "path": "/mail/messages"}
    assert http_request_for(listing, {"folder": "inbox"}) == ("GET", "/mail/messages", {"folder": "inbox"}, None)
    with pytest.raises(FormatError, match="missing required parameter"):
        http_request_for(move, {"folder": "archive"})


def test_errors_say_their_status_and_when_to_retry_and_long_answers_are_cut():
    assert tool_answer(200, {}, '{"ok": true}') == '{"ok": true}'
    assert tool_answer(429, {"Retry-After": "2"}, '{"error": "rate limited"}') == \
        'ERROR 429 (retry after 2 s): {"error": "rate limited"}'
    assert tool_answer(404, {}, "no such message").startswith("ERROR 404: ")
    long = tool_answer(200, {}, "x" * (MAX_ANSWER_CHARS + 10))
    assert long.endswith("[cut: 10 more characters]") and len(long) < MAX_ANSWER_CHARS + 100


def test_the_shell_style_tells_the_model_how_to_finish():
    harness = claw_shell_harness()
    prompt = harness.task_prompt("Tidy my inbox.")
    assert "Tidy my inbox." in prompt and "claw-tools" in prompt
    assert "COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT && finish --answer" in prompt and harness.name == "claw-shell"
    # A malformed turn is told the same way to finish, not the SWE harness's git submission.
    with pytest.raises(FormatError) as error:
        harness.parse(Turn(Message(role="assistant", content="THOUGHT: no block")))
    assert "finish --answer" in str(error.value) and "git" not in str(error.value)


def test_the_third_party_harness_is_told_about_the_command_line_tools():
    harness = claw_smolagents_harness(max_turns=3, wall_clock_s=30.0)
    text = harness.task_text("Tidy my inbox.")
    assert text.startswith("You are a personal assistant") and "Tidy my inbox." in text and "claw-tools" in text
    assert harness.name == "smolagents" and "3" in harness.command and harness.wall_clock_s == 30.0
