"""A third-party harness on a Claw task: mini-swe-agent's own loop through the recording proxy, in a real
sandbox, against ``orchard serve``; graded from the environment's state like Orchard's own harnesses."""

from __future__ import annotations

import pytest

from orchard.rollout.proxy_records import read_session
from orchard.tasks.claw.families import FAMILIES
from orchard.tasks.claw.mini_swe_agent import HARNESS, claw_config, run_claw_instance
from orchard.tasks.claw.task import ClawTask
from tests.conftest import mini_swe_agent_model


@pytest.mark.slow
def test_mini_swe_agent_runs_a_claw_task_through_the_proxy_and_is_graded_from_state(proxy, client):
    family = FAMILIES["notification_cleanup"]
    task = ClawTask(family.make(family.PARAMS[0], 0))
    session = proxy.open(harness=HARNESS, sampling={"temperature": 0, "max_tokens": 24})
    config = claw_config("mini")
    config["agent"]["step_limit"] = 2
    model = mini_swe_agent_model(config, session)
    run = run_claw_instance(client, task, model, config=config)
    proxy.close(session)
    assert "claw-tools" in run.trajectory.messages[1].content and task.prompt in run.trajectory.messages[1].content
    assert run.trajectory.harness == HARNESS
    # A random policy in two steps does not clean notifications up: the task's tests, run on the services' state, say so.
    assert run.trajectory.outcome.reward == -1.0 and not run.trajectory.outcome.resolved
    assert {t["name"] for t in run.trajectory.metadata["claw"]["tests"]} == {t.name for t in task.spec.tests}
    calls = read_session(session["records"]).calls
    assert len(calls) == 2 and all(c["usable_for_rl"] for c in calls)  # both model calls, trainable
