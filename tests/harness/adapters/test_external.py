"""External harnesses as real processes beside real sandboxes, their calls through a real ``orchard proxy``:
smolagents' own CodeAgent on an SWE task, a harness that outruns its wall clock, one that crashes, and
the conversation a session's calls add up to."""

from __future__ import annotations

import sys

import httpx
import pytest

from orchard.data.trajectory import EndReason
from orchard.harness.adapters.external import ExternalHarness, ExternalRunner, trajectory_from_calls
from orchard.harness.adapters.smolagents_agent import smolagents_harness
from orchard.harness.task import FunctionTask
from orchard.rollout.proxy_client import ProxyClient
from orchard.rollout.proxy_records import read_session
from orchard.tasks.swe.diffs import unified_diff
from orchard.tasks.swe.instance import SWEInstance
from orchard.tasks.swe.task import SWETask
from orchard.tasks.swe.workspace import REPO_DIR, submission_patch
from orchard.train.rollouts import policy_rows, recorded_rows
from tests.conftest import ADMIN
from tests.tasks.swe.calc import write_calc_repo

OPS = "def add(a, b):\n    return a - b\n"
TESTS = "from calc.ops import add\n\n\ndef test_add():\n    assert add(2, 3) == 5\n"


def _call(number: int, messages: list[dict], reply: str, prompt: list[int], ids: list[int], status: str = "ok") -> dict:
    return {"call": number, "status": status, "request": {"messages": messages}, "prompt_token_ids": [prompt],
            "completions": [{"text": reply, "token_ids": ids, "logprobs": [-0.1] * len(ids)}], "weight_version": 3}


def test_a_sessions_calls_add_up_to_one_conversation():
    system, user = {"role": "system", "content": "Be brief."}, {"role": "user", "content": [{"type": "text", "text": "Go"}]}
    first = [system, user]
    second = [*first, {"role": "assistant", "content": "ls"}, {"role": "tool", "content": "a.py", "tool_call_id": "c1"}]
    calls = [_call(1, first, "ls", [1, 2], [3]), _call(2, second, "done", [1, 2, 3, 4], [5]),
             _call(3, second, "", [9], [], status="upstream_error"),  # no completion: left out
             _call(4, [system, {"role": "assistant", "content": "ls"}, {"role": "user", "content": "again"}], "ok",
                   [7], [8])]  # history rewritten
    trajectory = trajectory_from_calls(calls, task_id="t", harness="h", policy="p")
    assert [(m.role, m.content) for m in trajectory.messages] == [
        ("system", "Be brief."), ("user", "Go"), ("assistant", "ls"), ("tool", "a.py"), ("assistant", "done"),
        ("system", "Be brief."), ("user", "again"), ("assistant", "ok")]
    assert trajectory.messages[3].tool_call_id == "c1" and trajectory.metadata["history_rewritten"] == 1
    reply = trajectory.messages[4]
    assert reply.token_ids == [5] and reply.prompt_tokens == 4 and reply.weight_version == 3


@pytest.fixture
async def proxy_client(proxy):
    client = ProxyClient(proxy.root, ADMIN)
    yield client
    await client.aclose()


def _shell_harness(script: str, wall_clock_s: float) -> ExternalHarness:
    return ExternalHarness("shell", [sys.executable, "-c", script], wall_clock_s=wall_clock_s)


async def test_a_harness_that_outruns_its_wall_clock_is_killed_and_not_graded(aclient, proxy_client, tmp_path):
    marker = tmp_path / "still-running"
    script = f"import time, pathlib; time.sleep(30); pathlib.Path({str(marker)!r}).touch()"
    runner = ExternalRunner(aclient, _shell_harness(script, wall_clock_s=1.0), proxy_client)
    trajectory = await runner.run_one(FunctionTask("slow", "Wait."), seed=1)
    assert trajectory.end_reason is EndReason.TIME_LIMIT and trajectory.outcome.reward is None
    assert trajectory.outcome.status == "timed_out" and trajectory.metadata["harness_exit"] is None
    assert not marker.exists()  # killed with its group, not left running


async def test_a_harness_that_crashes_is_aborted_with_its_output(aclient, proxy_client):
    script = "import os, sys; print('no key?', bool(os.environ['OPENAI_API_KEY'])); sys.exit(3)"
    runner = ExternalRunner(aclient, _shell_harness(script, wall_clock_s=30.0), proxy_client)
    trajectory = await runner.run_one(FunctionTask("crash", "Crash."), seed=2)
    assert trajectory.end_reason is EndReason.POLICY_ERROR and trajectory.outcome.status == "aborted"
    assert trajectory.metadata["harness_exit"] == 3 and "no key? True" in trajectory.metadata["harness_output"]
    assert trajectory.outcome.reward is None and trajectory.metadata["calls"] == 0


@pytest.mark.slow
async def test_smolagents_runs_its_own_loop_through_the_proxy(aclient, proxy_client, policy_server, tmp_path):
    instance = SWEInstance(instance_id="calc__add", repo="orchard/calc", base_commit="0" * 40,
                           problem_statement="add subtracts.", patch=unified_diff(OPS, OPS.replace("-", "+"), "calc/ops.py"),
                           FAIL_TO_PASS=("tests/test_ops.py::test_add",), repo_path=write_calc_repo(tmp_path, OPS, TESTS))
    harness = smolagents_harness(max_turns=1, submission=submission_patch, wall_clock_s=300.0, cwd=REPO_DIR)
    runner = ExternalRunner(aclient, harness, proxy_client, sampling={"temperature": 0.0, "max_tokens": 24})
    trajectory = await runner.run_one(SWETask(instance), seed=5)

    assert trajectory.harness == "smolagents" and trajectory.end_reason is EndReason.SUBMITTED, \
        trajectory.metadata.get("harness_output")
    assert trajectory.outcome.reward == -1.0 and not trajectory.outcome.resolved  # a random model fixes nothing
    record = read_session(trajectory.metadata["proxy_records"])
    assert record.status == "closed" and record.trainable and len(record.calls) >= 2  # its steps, its final answer
    system = record.calls[0]["request"]["messages"][0]
    assert system["role"] == "system" and "bash" in str(system["content"])  # smolagents' prompt, with Orchard's tool
    for call in record.calls:  # every recorded completion is the server's own, token for token
        direct = httpx.post(f"{policy_server.url}/chat/completions", timeout=120,
                            json={**call["upstream_request"], "stream": False}).json()
        assert call["prompt_token_ids"][0] == direct["prompt_token_ids"]
        assert call["completions"][0]["token_ids"] == direct["choices"][0]["token_ids"]
    sampled = [m for m in trajectory.messages if m.role == "assistant"]
    assert len(sampled) == len(record.calls) and all(m.token_ids for m in sampled)
    rows = policy_rows(trajectory, advantage=0.5, chat_format=None, rows_per="turn")  # the recorded ids, not re-rendered
    assert rows == recorded_rows(record.calls, 0.5)
    assert sum(sum(row["loss_mask"]) for row in rows) == sum(len(m.token_ids) for m in sampled)
