"""The CodeAct harness: a scripted model fixes the bug with tool calls; format errors; the schemas."""

from __future__ import annotations

import pytest

from orchard.data.trajectory import Message, Outcome, ToolCall
from orchard.harness import CodeActHarness, EnginePolicy, FormatError, FunctionTask, Limits, Turn, run_episode
from orchard.harness.codeact import TOOLS
from orchard.harness.tools import check_arguments
from tests.harness.scripted import REPO, ScriptedEngine, call, make_repo

SOLVE = [
    "<think>\nLook at the repository first.\n</think>\n\n" + call("str_replace_editor", command="view", path=REPO),
    "Run the tests.\n" + call("execute_bash", command="python3 -m unittest test_calc"),
    call("str_replace_editor", command="str_replace", path=f"{REPO}/calc.py", old_str="return a - b",
         new_str="return a + b"),
    call("str_replace_editor", command="create", path=f"{REPO}/NOTES.md", file_text="add() adds now.\n"),
    "Check, then finish.\n" + call("execute_bash", command="python3 -m unittest test_calc") + "\n"
    + call("finish", message="Fixed add()."),
]


async def test_a_scripted_model_fixes_the_bug_with_tools(aclient, tokenizer, chat_format):
    engine = ScriptedEngine(tokenizer, SOLVE, text=True)
    seen = {}

    async def grade(sandbox, trajectory) -> Outcome:
        seen["status"] = (await sandbox.exec("git status --porcelain", cwd=REPO, timeout=30)).stdout
        result = await sandbox.exec("python3 -m unittest test_calc", cwd=REPO, timeout=60)
        return Outcome(reward=float(result.ok), resolved=result.ok)

    trajectory = await run_episode(aclient, CodeActHarness(), EnginePolicy(engine, chat_format),
                                   FunctionTask("calc", "calc.add returns wrong results.", make_repo, grade))

    assert trajectory.outcome == Outcome(reward=1.0, resolved=True, status="completed")
    meta = trajectory.metadata
    assert meta["end_reason"] == "submitted" and meta["steps"] == 5 and meta["finish_message"] == "Fixed add()."
    diff = meta["submission"]
    assert "+    return a + b" in diff and "diff --git a/NOTES.md b/NOTES.md\nnew file mode 100644" in diff
    assert "__pycache__" not in diff
    assert seen["status"] == " M calc.py\n?? NOTES.md\n"  # the repository's own index was left alone

    messages = trajectory.messages
    assert [m.role for m in messages] == (["system", "user"] + ["assistant", "tool"] * 4
                                          + ["assistant", "tool"])  # finish answers nothing
    assert messages[2].reasoning == "Look at the repository first." and messages[2].content == ""
    assert messages[4].content == "Run the tests."
    assert [c.name for c in messages[10].tool_calls] == ["execute_bash", "finish"]
    for assistant in messages[2::2]:
        assert assistant.token_ids and len(assistant.logprobs) == len(assistant.token_ids)
    for assistant, tool in zip(messages[2:10:2], messages[3:11:2], strict=True):
        assert tool.tool_call_id == assistant.tool_calls[0].id and tool.tool_call_id.startswith("call_")
    listing, failing, edited, created, passing = (m.content for m in messages[3::2])
    assert listing.startswith(f"Here's the files and directories up to 2 levels deep in {REPO}")
    assert f"{REPO}/calc.py" in listing and ".git" not in listing
    assert "FAILED (failures=1)" in failing and failing.endswith("[The command completed with exit code 1.]")
    assert edited.startswith(f"The file {REPO}/calc.py has been edited.") and "     2\t    return a + b" in edited
    assert created == f"File created successfully at: {REPO}/NOTES.md"
    assert passing.endswith("OK\n[The command completed with exit code 0.]")
    assert messages[2].tool_calls[0].arguments == {"command": "view", "path": REPO}

    first = tokenizer.decode(engine.prompts[0])
    assert "<tools>" in first and '"name": "str_replace_editor"' in first and "You are an autonomous" in first
    assert "<tool_response>\nFile created successfully" in tokenizer.decode(engine.prompts[4])
    for before, after, sampled in zip(engine.prompts, engine.prompts[1:], messages[2::2], strict=False):
        assert after[:len(before) + len(sampled.token_ids)] == before + sampled.token_ids
    assert trajectory.tools == TOOLS and trajectory.harness == "codeact"


async def test_format_errors_are_answered_and_counted(aclient, tokenizer, chat_format):
    replies = [
        "I am done, I think.",  # no tool call
        call("delete_everything", path="/"),  # undefined tool
        call("str_replace_editor", command="view"),  # missing path
        call("str_replace_editor", command="move", path=REPO),  # outside the enum
        call("execute_bash", command="ls", timeout="10"),  # wrong type
        call("execute_bash", command="ls") + call("execute_bash", command="ls", cwd="/tmp"),  # one bad call spoils the turn
        '<tool_call>\n{"name": "execute_bash", "arguments": {"command": "ls"</tool_call>',  # not JSON
        call("str_replace_editor", command="str_replace", path=f"{REPO}/calc.py", old_str="nowhere"),
        call("finish"),
    ]
    engine = ScriptedEngine(tokenizer, replies)
    trajectory = await run_episode(aclient, CodeActHarness(), EnginePolicy(engine, chat_format),
                                   FunctionTask("try", "Try.", make_repo), limits=Limits(max_format_errors=10))
    assert trajectory.outcome.status == "completed" and trajectory.metadata["format_errors"] == 7
    assert trajectory.metadata["submission"] == ""  # nothing changed
    answers = trajectory.messages[3::2]
    assert answers[0].role == "user" and answers[0].content.startswith("You did not call a tool.")
    assert answers[1].role == "tool" and "there is no tool named 'delete_everything'" in answers[1].content
    assert answers[1].tool_call_id == trajectory.messages[4].tool_calls[0].id
    assert "missing required parameter(s): path" in answers[2].content
    assert "`command` must be one of view, create, str_replace, insert, got 'move'" in answers[3].content
    assert "`timeout` must be of type number, got str" in answers[4].content
    sixth = trajectory.messages[12]
    assert len(sixth.tool_calls) == 2 and [m.role for m in trajectory.messages[13:15]] == ["tool", "tool"]
    assert all("unknown parameter(s): cwd" in m.content and "None of the tool calls" in m.content
               for m in trajectory.messages[13:15])
    not_json = trajectory.messages[15]
    assert not not_json.tool_calls and "<tool_call>" in not_json.content  # the raw text is kept
    assert trajectory.messages[16].role == "user" and "could not be parsed" in trajectory.messages[16].content
    # A valid call that fails is an observation, not a format error.
    assert trajectory.messages[18].content.startswith("ERROR:\nNo replacement was performed, old_str `nowhere`")


def test_check_arguments_follows_the_schema():
    editor = TOOLS[1]["function"]["parameters"]
    check_arguments(editor, {"command": "view", "path": "/a", "view_range": [1, -1]})
    for arguments, message in [
        ({"command": "view", "path": "/a", "view_range": [1, "2"]}, "array of integers"),
        ({"command": "insert", "path": "/a", "insert_line": True}, "of type integer, got bool"),
        ({"command": "view", "path": 3}, "`path` must be of type string"),
        ({"path": "/a"}, "missing required parameter"),
    ]:
        with pytest.raises(FormatError, match=message):
            check_arguments(editor, arguments)
    check_arguments(TOOLS[0]["function"]["parameters"], {"command": "ls", "timeout": 2.5})
    check_arguments(TOOLS[2]["function"]["parameters"], {})


def test_arguments_that_are_not_an_object_are_a_format_error():
    turn = Turn(Message(role="assistant", tool_calls=[ToolCall(id="c1", name="finish", arguments="oops")]))
    with pytest.raises(FormatError, match="must be a JSON object"):
        CodeActHarness().parse(turn)


def test_bad_settings_are_refused():
    with pytest.raises(ValueError, match="absolute"):
        CodeActHarness(cwd="repo")
    with pytest.raises(ValueError, match="command_timeout"):
        CodeActHarness(command_timeout=900, max_command_timeout=600)
    with pytest.raises(ValueError, match="codeact tools"):
        CodeActHarness(tools=TOOLS[:2])
