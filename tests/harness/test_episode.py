"""Episodes of any Task: graded only when the policy ended them, timing recorded, set-ups forked from a snapshot."""

from __future__ import annotations

import pytest

from orchard.data.trajectory import Message, Outcome
from orchard.env.client import AsyncSandbox
from orchard.harness import BashHarness, EpisodeRunner, FunctionTask, Limits, TaskFamily, Turn, run_episode
from orchard.harness.episode import SandboxPool, SetupCache

SUBMIT = "```bash\necho COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT && cat /workspace/repo/state\n```"


class Replies:
    """A policy that answers from a script (no model)."""

    name = "replies"

    def __init__(self, *replies: str) -> None:
        self.replies = list(replies)

    async def act(self, conversation, *, max_context=None):
        return Turn(Message(role="assistant", content=self.replies.pop(0)))


class Counting:
    """A task whose set-up writes a file and counts its calls; its grade reads what the episode left."""

    def __init__(self, family: TaskFamily) -> None:
        self.setups, self.grades, self.family = 0, 0, family

    def task(self, task_id: str) -> FunctionTask:
        async def setup(sandbox: AsyncSandbox) -> None:
            self.setups += 1
            await sandbox.write_file("/workspace/repo/state", f"set up for {task_id}\n")

        async def grade(sandbox, trajectory) -> Outcome:
            self.grades += 1
            resolved = trajectory.metadata["submission"] == f"set up for {task_id}\n"
            return Outcome(reward=1.0 if resolved else -1.0, resolved=resolved)

        return FunctionTask(task_id, "Say what you were set up for.", setup, grade, self.family)


async def test_the_wall_clock_leaves_an_episode_ungraded_with_reward_none(aclient):
    counting = Counting(TaskFamily("counting"))
    trajectory = await run_episode(aclient, BashHarness(command_timeout=60), Replies("```bash\nsleep 30\n```"),
                                   counting.task("t"), limits=Limits(time_limit=1.0))
    assert trajectory.outcome.status == "timed_out" and trajectory.outcome.reward is None
    assert counting.setups == 1 and counting.grades == 0  # the paper excludes time-outs: not graded
    graded = await run_episode(aclient, BashHarness(), Replies(SUBMIT), counting.task("t"))
    assert graded.outcome == Outcome(reward=1.0, resolved=True, status="completed") and counting.grades == 1
    timing = graded.metadata["episode_timing"]
    assert set(timing) == {"create_s", "setup_s", "grade_s"} and all(v >= 0 for v in timing.values())


async def test_a_set_up_in_files_is_done_once_and_forked_for_every_episode(aclient):
    counting = Counting(TaskFamily("forked", setup_in_files=True))
    async with SetupCache(aclient) as setups:
        runner = EpisodeRunner(aclient, BashHarness(), concurrency=3, setups=setups)
        trajectories = [await runner.run_one(counting.task(name), seed, policy=Replies(SUBMIT))
                        for name in ("a", "b") for seed in range(3)]
        snapshots = {s.id for s in await aclient.snapshots()}
        assert set(setups.snapshots.values()) <= snapshots and len(setups.snapshots) == 2
    assert counting.setups == 2  # once per task, not once per episode
    assert [t.outcome.resolved for t in trajectories] == [True] * 6  # each episode saw its own task's set-up
    assert len({t.metadata["sandbox_id"] for t in trajectories}) == 6
    assert not set(setups.snapshots.values()) & {s.id for s in await aclient.snapshots()}  # deleted on exit
    # A family whose set-up starts processes is set up in every episode.
    live = Counting(TaskFamily("live"))
    async with SetupCache(aclient) as setups:
        runner = EpisodeRunner(aclient, BashHarness(), setups=setups)
        for seed in range(2):
            assert (await runner.run_one(live.task("c"), seed, policy=Replies(SUBMIT))).outcome.resolved
    assert live.setups == 2 and not setups.snapshots


async def test_a_pooled_sandbox_reaped_while_idle_is_replaced_not_handed_out(aclient):
    counting = Counting(TaskFamily("pooled", reusable=True))
    async with SandboxPool(size=1) as pool:
        first = await run_episode(aclient, BashHarness(), Replies(SUBMIT), counting.task("a"), pool=pool)
        assert first.outcome.resolved and len(pool.idle["pooled"]) == 1
        # The orchestrator reaps an idle sandbox whose heartbeats stopped (a long training stage held the loop).
        await aclient.delete(first.metadata["sandbox_id"])
        second = await run_episode(aclient, BashHarness(), Replies(SUBMIT), counting.task("b"), pool=pool)
    assert second.outcome == Outcome(reward=1.0, resolved=True, status="completed"), second.metadata.get("error")
    assert second.metadata["sandbox_id"] != first.metadata["sandbox_id"]


async def test_a_runner_without_a_policy_says_so(aclient):
    with pytest.raises(ValueError, match="needs a harness and a policy"):
        await EpisodeRunner(aclient, BashHarness()).run_one(Counting(TaskFamily("x")).task("t"), 0)
    with pytest.raises(ValueError, match="concurrency"):
        EpisodeRunner(aclient, concurrency=0)


async def test_a_pristine_grading_family_is_graded_in_a_fresh_copy_of_its_set_up(aclient):
    graded_in: list[tuple[str, str, bool]] = []

    async def setup(sandbox: AsyncSandbox) -> None:
        await sandbox.write_file("/workspace/repo/state", "set up\n")

    async def grade(sandbox: AsyncSandbox, trajectory) -> Outcome:
        left = await sandbox.exec("cat /workspace/repo/state; ls /workspace/repo; pgrep -x sleep || true")
        graded_in.append((sandbox.id, left.stdout, trajectory.metadata["sandbox_id"] in
                          {s.id for s in await aclient.list()}))
        return Outcome(reward=1.0, resolved=True)

    family = TaskFamily("pristine", setup_in_files=True, pristine_grading=True)
    task = FunctionTask("p", "Change the state.", setup, grade, family)
    tamper = ("```bash\necho tampered > /workspace/repo/state && touch /workspace/repo/left && "
              "(setsid sleep 987 &) && echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT\n```")
    for setups in (None, SetupCache(aclient)):  # set up anew, and forked from the set-up snapshot
        trajectory = await run_episode(aclient, BashHarness(), Replies(tamper), task, setups=setups)
        sandbox_id, seen, episode_alive = graded_in[-1]
        assert trajectory.outcome.reward == 1.0 and sandbox_id != trajectory.metadata["sandbox_id"]
        assert seen == "set up\nstate\n"  # no tampering, no new file, no process left behind
        assert not episode_alive  # the episode's sandbox was deleted before the grader ran
        if setups is not None:
            await setups.close()
    assert not {s.id for s in await aclient.list()} & {g[0] for g in graded_in}  # the grader's sandboxes too
