"""The bash harness: a scripted model fixes a bug in a real sandbox, and the action syntax."""

from __future__ import annotations

import pytest

from orchard.data.trajectory import Message, Outcome
from orchard.harness import BashHarness, EnginePolicy, FormatError, FunctionTask, Turn, run_episode
from orchard.harness.bash import SUBMIT_COMMAND
from orchard.rollout.types import SamplingParams
from tests.harness.scripted import REPO, ScriptedEngine, make_repo

SOLVE = [
    "<think>\nFirst see what fails.\n</think>\n\nTHOUGHT: Run the tests.\n\n```bash\npython3 -m unittest test_calc\n```",
    "THOUGHT: `add` subtracts. Fix it.\n\n```bash\nsed -i 's/return a - b/return a + b/' calc.py && cat calc.py\n```",
    "THOUGHT: Run the tests again.\n\n```bash\npython3 -m unittest test_calc\n```",
    f"THOUGHT: The tests pass; submit.\n\n```bash\n{SUBMIT_COMMAND}\n```",
]


def turn(content: str) -> Turn:
    return Turn(Message(role="assistant", content=content))


async def grade_by_tests(sandbox, trajectory) -> Outcome:
    result = await sandbox.exec("python3 -m unittest test_calc", cwd=REPO, timeout=60)
    return Outcome(reward=float(result.ok), resolved=result.ok)


async def test_a_scripted_model_fixes_the_bug_and_submits_the_diff(aclient, tokenizer, chat_format):
    engine = ScriptedEngine(tokenizer, SOLVE)
    policy = EnginePolicy(engine, chat_format, SamplingParams(max_tokens=512, temperature=0.7, seed=3))
    task = FunctionTask("calc-1", "calc.add returns wrong results.", make_repo, grade_by_tests)
    trajectory = await run_episode(aclient, BashHarness(), policy, task, seed=11)

    assert trajectory.outcome == Outcome(reward=1.0, resolved=True, status="completed")
    meta = trajectory.metadata
    assert meta["end_reason"] == "submitted" and meta["steps"] == 4 and meta["format_errors"] == 0
    submission = meta["submission"]
    assert "--- a/calc.py" in submission and "-    return a - b" in submission and "+    return a + b" in submission
    assert submission.startswith("diff --git")  # the sentinel line is not part of the submission

    messages = trajectory.messages
    assert [m.role for m in messages] == ["system", "user"] + ["assistant", "user"] * 3 + ["assistant"]
    assert "calc.add returns wrong results." in messages[1].content and REPO in messages[1].content
    assert messages[2].reasoning == "First see what fails." and messages[2].content.startswith("THOUGHT: Run")
    failing, fixed, passing = messages[3].content, messages[5].content, messages[7].content
    assert failing.startswith("<returncode>1</returncode>\n<output>\n") and "FAILED (failures=1)" in failing
    assert "return a + b" in fixed and passing.startswith("<returncode>0</returncode>") and "\nOK" in passing
    for message, reply, prompt in zip(messages[2::2], SOLVE, engine.prompts, strict=True):
        assert message.token_ids == [*tokenizer.encode(reply), tokenizer.token_id("<|im_end|>")]
        assert message.logprobs is not None and len(message.logprobs) == len(message.token_ids)
        # Each prompt is the previous prompt, then the ids the model sampled, then the new turns.
        rendered = chat_format.render([m.to_chat() for m in messages[:messages.index(message)]],
                                      add_generation_prompt=True)
        assert prompt == rendered.token_ids
    for before, after, sampled in zip(engine.prompts, engine.prompts[1:], messages[2::2], strict=False):
        assert after[:len(before) + len(sampled.token_ids)] == before + sampled.token_ids
    assert len({s.seed for s in engine.samplings}) == 4  # turns are not sampled with one seed
    assert all(s.temperature == 0.7 and tokenizer.token_id("<|im_end|>") in s.stop_token_ids
               for s in engine.samplings)
    assert trajectory.harness == "bash" and trajectory.policy == "engine" and trajectory.tools is None


def test_exactly_one_bash_block_is_an_action():
    harness = BashHarness()
    [action] = harness.parse(turn("THOUGHT: look.\n\n```bash\nls -la\n```\n"))
    assert action.name == "bash" and action.arguments == {"command": "ls -la"}
    [action] = harness.parse(turn("```bash\ncat <<'EOF' > a.txt\nx\nEOF\n```"))
    assert action.arguments["command"] == "cat <<'EOF' > a.txt\nx\nEOF"
    for content, found in [("I will just think.", "0"), ("```bash\nls\n```\nthen\n```bash\npwd\n```", "2"),
                           ("```python\nprint(1)\n```", "0"), ("```bash\n   \n```", "an empty one")]:
        with pytest.raises(FormatError, match=f"it contained {found}"):
            harness.parse(turn(content))
    with pytest.raises(FormatError, match="there are no tools here"):
        harness.parse(Turn(Message(role="assistant", content="", tool_calls=[{"name": "ls", "arguments": {}}])))


def test_a_block_inside_the_reasoning_does_not_count():
    message = Message(role="assistant", content="THOUGHT: done thinking.", reasoning="```bash\nls\n```")
    with pytest.raises(FormatError):
        BashHarness().parse(Turn(message))


def test_long_outputs_show_head_and_tail_like_mini_swe_agent():
    harness = BashHarness(output_limit=100)
    short = harness.observation(0, "hello\n")
    assert short == "<returncode>0</returncode>\n<output>\nhello\n</output>"
    long = harness.observation(2, "".join(f"{i:04}\n" for i in range(1000)))  # 5000 characters
    assert long.startswith("<returncode>2</returncode>\n<warning>")
    head = long.split("<output_head>\n")[1].split("\n</output_head>")[0]
    tail = long.split("<output_tail>\n")[1].split("\n</output_tail>")[0]
    assert head.startswith("0000\n0001") and len(head) == 50 and len(tail) == 50 and tail.endswith("0999\n")
    assert "<elided_chars>\n4900 characters elided\n</elided_chars>" in long


def test_bad_settings_are_refused():
    with pytest.raises(ValueError, match="absolute"):
        BashHarness(cwd="repo")
    with pytest.raises(ValueError, match="command_timeout"):
        BashHarness(command_timeout=0)


async def test_a_command_timeout_is_reported_and_the_run_goes_on(aclient, tokenizer, chat_format):
    replies = ["```bash\necho started && sleep 30\n```", "```bash\necho COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT\n```"]
    policy = EnginePolicy(ScriptedEngine(tokenizer, replies), chat_format)

    async def workspace(sandbox):
        await sandbox.exec("mkdir -p /workspace/repo", timeout=30)

    trajectory = await run_episode(aclient, BashHarness(command_timeout=1), policy,
                                   FunctionTask("wait", "Wait.", workspace))
    assert trajectory.outcome.status == "completed" and trajectory.metadata["submission"] == ""
    observation = trajectory.messages[3].content
    assert observation.startswith("The command timed out after 1 seconds and was killed.")
    assert "<output>\nstarted\n</output>" in observation
