"""The ReAct core: format errors, limits and their statuses, failures, and the sandbox lifecycle.

The loop is driven through the bash harness with a scripted engine, in real sandboxes.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from orchard.data.trajectory import Message, Outcome
from orchard.env.client import AsyncSandbox
from orchard.harness import BashHarness, EnginePolicy, FunctionTask, Limits, run_agent, run_episode
from tests.harness.scripted import ScriptedEngine

ECHO = "THOUGHT: one step.\n\n```bash\necho step\n```"


@pytest.fixture(scope="module")
async def box(aclient) -> AsyncIterator[AsyncSandbox]:
    async with aclient.create(memory="512Mi") as sandbox:
        await sandbox.exec("mkdir -p /workspace/repo", timeout=30)
        yield sandbox


async def mkrepo(sandbox: AsyncSandbox) -> None:
    await sandbox.exec("mkdir -p /workspace/repo", timeout=30)


async def live_ids(aclient) -> set[str]:
    return {info.id for info in await aclient.list()}


async def test_format_errors_are_fed_back_and_consecutive_ones_end_the_run_truncated(box, tokenizer, chat_format):
    replies = ["I think I should look around.", "```bash\nls\n```\nand\n```bash\npwd\n```", ECHO,
               "no block", "still none", "none again", ECHO]
    engine = ScriptedEngine(tokenizer, replies)
    trajectory = await run_agent(BashHarness(), EnginePolicy(engine, chat_format), box, "Do it.",
                                 limits=Limits(max_format_errors=3))

    assert trajectory.outcome.status == "truncated"
    meta = trajectory.metadata
    assert (meta["end_reason"], meta["steps"], meta["format_errors"]) == ("format_errors", 6, 5)
    assert len(engine.replies) == 1  # the run stopped at the third error in a row
    roles = [m.role for m in trajectory.messages]
    assert roles == ["system", "user"] + ["assistant", "user"] * 6
    answers = [m.content for m in trajectory.messages[3::2]]
    assert answers[0].startswith("Your response must contain EXACTLY ONE bash code block; it contained 0.")
    assert answers[1].startswith("Your response must contain EXACTLY ONE bash code block; it contained 2.")
    assert answers[2] == "<returncode>0</returncode>\n<output>\nstep\n</output>"  # the good turn ran
    assert all("EXACTLY ONE" in answer for answer in answers[3:])
    assert all(m.token_ids for m in trajectory.messages[2::2])  # rejected turns keep their sampled ids


async def test_the_step_limit_truncates_and_a_grade_keeps_the_status(aclient, tokenizer, chat_format):
    engine = ScriptedEngine(tokenizer, [ECHO] * 4)

    async def grade(sandbox, trajectory) -> Outcome:
        return Outcome(reward=0.5, resolved=False, status="completed")

    trajectory = await run_episode(aclient, BashHarness(), EnginePolicy(engine, chat_format),
                                   FunctionTask("echo", "Echo.", mkrepo, grade), limits=Limits(max_turns=3))
    assert trajectory.outcome == Outcome(reward=0.5, resolved=False, status="truncated")
    assert trajectory.metadata["end_reason"] == "step_limit" and trajectory.metadata["steps"] == 3
    assert len(engine.replies) == 1 and trajectory.messages[-1].role == "user"  # the third action ran


async def test_the_token_budget_caps_generation_then_truncates(box, tokenizer, chat_format):
    harness = BashHarness()
    first = chat_format.render([{"role": "system", "content": harness.system_prompt},
                                {"role": "user", "content": harness.task_prompt("Do it.")}],
                               add_generation_prompt=True).token_ids
    long_reply = "THOUGHT: " + "let me think about this carefully " * 20 + "\n\n```bash\nls\n```"
    engine = ScriptedEngine(tokenizer, [long_reply])
    trajectory = await run_agent(harness, EnginePolicy(engine, chat_format), box, "Do it.",
                                 limits=Limits(max_tokens=len(first) + 10))

    assert engine.prompts == [first] and engine.samplings[0].max_tokens == 10
    assert trajectory.outcome.status == "truncated" and trajectory.metadata["end_reason"] == "token_limit"
    assert trajectory.metadata["context_tokens"] == len(first) + 10
    assert trajectory.messages[-1].role == "assistant" and len(trajectory.messages[-1].token_ids) == 10


async def test_a_prompt_that_fills_the_budget_truncates_before_sampling(box, tokenizer, chat_format):
    engine = ScriptedEngine(tokenizer, [ECHO, ECHO])
    harness = BashHarness()
    first = chat_format.render([{"role": "system", "content": harness.system_prompt},
                                {"role": "user", "content": harness.task_prompt("Do it.")}],
                               add_generation_prompt=True).token_ids
    # Room for the first turn, not for the second prompt (which adds the turn and its observation).
    trajectory = await run_agent(harness, EnginePolicy(engine, chat_format), box, "Do it.",
                                 limits=Limits(max_tokens=len(first) + 40))
    assert trajectory.outcome.status == "truncated" and trajectory.metadata["end_reason"] == "token_limit"
    assert len(engine.prompts) == 1 and trajectory.metadata["steps"] == 1
    assert "the budget is" in trajectory.metadata["error"]
    assert [m.role for m in trajectory.messages] == ["system", "user", "assistant", "user"]


async def test_the_wall_clock_times_out_and_kills_the_command(box, tokenizer, chat_format):
    engine = ScriptedEngine(tokenizer, ["```bash\nsleep 300\n```"])
    trajectory = await run_agent(BashHarness(command_timeout=600), EnginePolicy(engine, chat_format), box,
                                 "Wait.", limits=Limits(time_limit=1.0))
    assert trajectory.outcome.status == "timed_out" and trajectory.metadata["end_reason"] == "time_limit"
    assert trajectory.messages[-1].role == "assistant"
    # The cancelled command is killed (the sandbox reaps it a moment later): no live sleep is left.
    listing = "for p in /proc/[0-9]*; do echo $(cat $p/comm) $(cut -d' ' -f3 $p/stat); done 2>/dev/null"

    async def processes() -> list[tuple[str, str]]:
        return [tuple(line.split()) for line in (await box.exec(listing, timeout=30)).stdout.splitlines()]

    async with asyncio.timeout(30):
        while any(name == "sleep" and state not in ("Z", "X") for name, state in await processes()):
            await asyncio.sleep(0.05)
    assert any(name == "python" for name, _ in await processes())  # the listing works: the agent is in it


async def test_an_engine_error_aborts_and_the_sandbox_is_deleted(aclient, tokenizer, chat_format):
    engine = ScriptedEngine(tokenizer, [ECHO, RuntimeError("the engine fell over")])
    trajectory = await run_episode(aclient, BashHarness(), EnginePolicy(engine, chat_format),
                                   FunctionTask("echo", "Echo.", mkrepo))
    assert trajectory.outcome.status == "aborted" and trajectory.metadata["end_reason"] == "policy_error"
    assert trajectory.outcome.reward is None  # not the policy's doing: dropped, and never graded
    assert trajectory.metadata["error"] == "RuntimeError: the engine fell over"
    assert trajectory.metadata["steps"] == 1
    assert trajectory.metadata["sandbox_id"] not in await live_ids(aclient)


async def test_a_sandbox_error_aborts(box, tokenizer, chat_format):
    engine = ScriptedEngine(tokenizer, [ECHO])
    trajectory = await run_agent(BashHarness(cwd="/workspace/missing"), EnginePolicy(engine, chat_format), box,
                                 "Echo.")
    assert trajectory.outcome.status == "aborted" and trajectory.metadata["end_reason"] == "sandbox_error"
    assert "/workspace/missing" in trajectory.metadata["error"]


async def test_a_failing_setup_raises_and_the_sandbox_is_deleted(aclient, tokenizer, chat_format):
    seen = []

    async def setup(sandbox: AsyncSandbox) -> None:
        seen.append(sandbox.id)
        raise ValueError("the repository could not be cloned")

    policy = EnginePolicy(ScriptedEngine(tokenizer, []), chat_format)
    with pytest.raises(ValueError, match="could not be cloned"):
        await run_episode(aclient, BashHarness(), policy, FunctionTask("echo", "Echo.", setup))
    assert len(seen) == 1 and seen[0] not in await live_ids(aclient)


async def test_a_cancelled_episode_deletes_its_sandbox(aclient, tokenizer, chat_format):
    engine = ScriptedEngine(tokenizer, ["```bash\ntouch /workspace/started && sleep 30\n```"])
    seen: list[str] = []

    async def setup(sandbox: AsyncSandbox) -> None:
        seen.append(sandbox.id)
        await mkrepo(sandbox)

    episode = asyncio.create_task(run_episode(aclient, BashHarness(), EnginePolicy(engine, chat_format),
                                              FunctionTask("wait", "Wait.", setup)))
    async with asyncio.timeout(60):  # a bound for the waits below, not a timing assertion
        while not seen:
            await asyncio.sleep(0.05)
        watcher = await aclient.get(seen[0])
        while not await watcher.exists("/workspace/started"):  # the agent's command is running
            await asyncio.sleep(0.05)
    episode.cancel()
    with pytest.raises(asyncio.CancelledError):
        await episode
    assert seen[0] not in await live_ids(aclient)


async def test_bad_input_is_refused(box, tokenizer, chat_format):
    policy = EnginePolicy(ScriptedEngine(tokenizer, []), chat_format)
    with pytest.raises(ValueError, match="non-empty"):
        await run_agent(BashHarness(), policy, box, "  ")
    for bad in [{"max_turns": 0}, {"max_tokens": 0}, {"time_limit": 0}, {"max_format_errors": 0}]:
        with pytest.raises(ValueError, match=next(iter(bad))):
            Limits(**bad)


async def test_the_conversation_is_rendered_once_per_turn(box, tokenizer, chat_format):
    """Incremental rendering: a policy re-rendering the conversation from scratch would produce the
    same prompts, and a conversation that shrank (another episode reusing the state) is re-rendered."""
    engine = ScriptedEngine(tokenizer, [ECHO, ECHO, ECHO])
    policy = EnginePolicy(engine, chat_format)
    trajectory = await run_agent(BashHarness(), policy, box, "Echo.", limits=Limits(max_turns=2))
    assert [m.role for m in trajectory.messages] == ["system", "user", "assistant", "user", "assistant", "user"]
    from orchard.harness import Conversation

    conversation = Conversation(messages=trajectory.messages[:4])
    conversation.state[("EnginePolicy", id(policy))] = (chat_format.start(), 99)  # stale: more than there are
    turn = await policy.act(conversation)
    assert engine.prompts[-1] == engine.prompts[1] and turn.message.token_ids
    assert isinstance(turn.message, Message) and turn.prompt_tokens == len(engine.prompts[1])


async def test_episodes_share_one_policy_concurrently(aclient, tokenizer, chat_format):
    """Policies keep no per-episode state, so one serves many episodes at once; each episode's
    rendering cache lives in its own conversation."""
    submit = "```bash\necho COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT && cat /workspace/repo/name\n```"
    engine = ScriptedEngine(tokenizer, [ECHO] * 3 + [submit] * 3)
    policy = EnginePolicy(engine, chat_format, concurrency=2)

    def setup_named(name: str):
        async def setup(sandbox: AsyncSandbox) -> None:
            await sandbox.write_file("/workspace/repo/name", name)
        return setup

    # However the episodes interleave, the echoes are served first and each episode ends at its submission.
    trajectories = await asyncio.gather(*[
        run_episode(aclient, BashHarness(), policy, FunctionTask(name, "Say your name.", setup_named(name)))
        for name in ("a", "b", "c")])
    assert [t.outcome.status for t in trajectories] == ["completed"] * 3
    assert [t.metadata["submission"] for t in trajectories] == ["a", "b", "c"]
    assert len({t.metadata["sandbox_id"] for t in trajectories}) == 3
    ids = await live_ids(aclient)
    assert not ids & {t.metadata["sandbox_id"] for t in trajectories}
