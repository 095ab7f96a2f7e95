"""A harness no one here wrote, through the recording proxy: mini-swe-agent's own loop (litellm as
its client) on an SWE task in a real sandbox, against ``orchard serve``; every recorded completion
is the server's own (replayed greedily, it comes back token for token)."""

from __future__ import annotations

import httpx
import pytest

from orchard.harness.adapters.mini_swe_agent import load_config
from orchard.rollout.proxy_records import read_session
from orchard.tasks.swe.diffs import unified_diff
from orchard.tasks.swe.instance import SWEInstance
from orchard.tasks.swe.mini_swe_agent import run_swe_instance
from tests.conftest import mini_swe_agent_model
from tests.tasks.swe.calc import write_calc_repo

OPS = "def add(a, b):\n    return a - b\n"
TESTS = "from calc.ops import add\n\n\ndef test_add():\n    assert add(2, 3) == 5\n"


@pytest.mark.slow
def test_mini_swe_agent_runs_through_the_proxy_and_its_calls_are_the_server_s(proxy, policy_server, client,
                                                                            tmp_path):
    instance = SWEInstance(instance_id="calc__add", repo="orchard/calc", base_commit="0" * 40,
                           problem_statement="add subtracts.", patch=unified_diff(OPS, OPS.replace("-", "+"), "calc/ops.py"),
                           FAIL_TO_PASS=("tests/test_ops.py::test_add",), repo_path=write_calc_repo(tmp_path, OPS, TESTS))
    session = proxy.open(harness="mini-swe-agent", sampling={"temperature": 0, "max_tokens": 24})
    config = load_config("swebench_backticks")
    config["agent"]["step_limit"] = 1  # one call, checked against the server (tests/tasks/claw runs two a session)
    model = mini_swe_agent_model(config, session)
    run = run_swe_instance(client, instance, model, config=config, sandbox_spec={"memory": "512Mi"})
    proxy.close(session)
    assert run.trajectory.harness == "mini-swe-agent" and not run.trajectory.outcome.resolved
    calls = read_session(session["records"]).calls
    assert len(calls) == 1 and all(c["usable_for_rl"] for c in calls)
    for call in calls:
        direct = httpx.post(f"{policy_server.url}/chat/completions", timeout=120,
                            json={**call["upstream_request"], "stream": False}).json()
        assert call["prompt_token_ids"][0] == direct["prompt_token_ids"]
        assert call["completions"][0]["token_ids"] == direct["choices"][0]["token_ids"]
