"""mini-swe-agent's own agent loop in real Orchard sandboxes, graded by Orchard's SWE task layer.

The model is mini-swe-agent's ``DeterministicModel`` (and its tool-call twin), whose scripted turns
are written in its action formats and parsed by its own parsers; the prompts, observation templates
and limits come from its shipped SWE-bench configs. The task is a bug put into the shipped
``minicalc`` repository, graded with SWE-bench's rules.
"""

from __future__ import annotations

import itertools
import json
import platform
from types import SimpleNamespace

import pytest
from minisweagent.agents.default import DefaultAgent
from minisweagent.environments.local import LocalEnvironment
from minisweagent.exceptions import Submitted
from minisweagent.models.test_models import (
    DeterministicModel,
    DeterministicToolcallModel,
    make_output,
    make_toolcall_output,
)
from minisweagent.models.utils.actions_text import parse_regex_actions
from minisweagent.models.utils.actions_toolcall import parse_toolcall_actions
from pydantic import ValidationError

from orchard.env import SandboxNotFound
from orchard.env.client import NotADirectory
from orchard.harness.adapters.mini_swe_agent import OrchardEnvironment, load_config
from orchard.tasks.swe.diffs import unified_diff
from orchard.tasks.swe.generate import tree_digest
from orchard.tasks.swe.instance import SWEInstance
from orchard.tasks.swe.localtests import run_tests
from orchard.tasks.swe.mini_swe_agent import run_swe_instance
from orchard.tasks.swe.sources import shipped_source
from orchard.tasks.swe.testlog import passing

# LitellmTextbasedModelConfig.action_regex's default (importing that class imports litellm: seconds).
ACTION_REGEX = r"```mswea_bash_command\s*\n(.*?)\n```"
GOOD = '    if op == "-":\n        return left - right\n'
BUG = '    if op == "-":\n        return left + right\n'
EVALUATOR = "minicalc/evaluator.py"
SPEC = {"memory": "512Mi", "pids": 256}
_call_ids = itertools.count()


def text_turn(thought: str, command: str) -> dict:
    """A model reply in the text format (``swebench_backticks``), parsed by mini-swe-agent's parser."""
    content = f"THOUGHT: {thought}\n\n```mswea_bash_command\n{command}\n```"
    actions = parse_regex_actions(content, action_regex=ACTION_REGEX, format_error_template="{{error}}")
    return make_output(content, actions, cost=0.0)  # a local model costs nothing


def tool_turn(thought: str, *commands: str) -> dict:
    """A model reply with bash tool calls (``swebench``, 2.x's default), parsed by mini-swe-agent's parser."""
    calls = [{"id": f"call_{next(_call_ids)}", "type": "function",
              "function": {"name": "bash", "arguments": json.dumps({"command": command})}} for command in commands]
    parsed = [SimpleNamespace(id=c["id"], function=SimpleNamespace(**c["function"])) for c in calls]
    output = make_toolcall_output(thought, calls, parse_toolcall_actions(parsed, format_error_template="{{error}}"))
    output["extra"]["cost"] = 0.0
    return output


@pytest.fixture(scope="module")
def instance(tmp_path_factory) -> SWEInstance:
    """minicalc with subtraction that adds; FAIL_TO_PASS and PASS_TO_PASS from running its tests."""
    repo = tmp_path_factory.mktemp("minicalc") / "repo"
    shipped_source("minicalc").materialize(str(repo))
    evaluator = repo / EVALUATOR
    original = evaluator.read_text()
    assert original.count(GOOD) == 1, "the shipped minicalc changed: put the bug somewhere else"
    baseline = passing(run_tests(str(repo), ["tests"]).results)
    buggy = original.replace(GOOD, BUG)
    evaluator.write_text(buggy)
    still = passing(run_tests(str(repo), ["tests"]).results)
    fail_to_pass, pass_to_pass = sorted(baseline - still), sorted(baseline & still)
    assert fail_to_pass and pass_to_pass
    return SWEInstance(
        instance_id="minicalc__subtraction-adds", repo="orchard/minicalc", base_commit=tree_digest(str(repo)),
        problem_statement="calculate('10 - 4') returns 14: subtraction adds its operands.",
        patch=unified_diff(buggy, original, EVALUATOR), FAIL_TO_PASS=tuple(fail_to_pass),
        PASS_TO_PASS=tuple(pass_to_pass), repo_path=str(repo))


def observations(record: dict) -> list[str]:
    return [m["content"] for m in record["messages"] if m["role"] in ("user", "tool")][1:]  # after the task


def test_execute_answers_as_mini_swe_agents_own_environment(sandbox, tmp_path):
    """Output, exit status, timeout and submission: the same dicts as LocalEnvironment's, byte for byte."""
    ours = OrchardEnvironment(sandbox=sandbox, timeout=2)
    theirs = LocalEnvironment(cwd=str(tmp_path), timeout=2)
    answers = {}
    for command in ("echo out; echo err >&2; echo more; exit 3",  # stderr interleaved into the output
                    "echo partial; sleep 30",  # killed at the timeout, partial output kept
                    "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT; exit 1"):  # a failed submission is not one
        answers[command] = ours.execute({"command": command})
        assert answers[command] == theirs.execute({"command": command}), command
    assert answers["echo out; echo err >&2; echo more; exit 3"]["output"] == "out\nerr\nmore\n"
    timed_out = answers["echo partial; sleep 30"]
    assert timed_out["output"] == "partial\n"
    assert timed_out["returncode"] == -1 and timed_out["extra"]["exception_type"] == "TimeoutExpired"
    assert "timed out after 2 seconds" in timed_out["exception_info"]

    submit = "printf '  \\nCOMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT\\ndiff --git a/x b/x\\n+y\\n'"
    with pytest.raises(Submitted) as ours_submitted:
        ours.execute({"command": submit})
    with pytest.raises(Submitted) as theirs_submitted:
        theirs.execute({"command": submit})
    assert ours_submitted.value.messages == theirs_submitted.value.messages
    assert ours_submitted.value.messages[0]["extra"]["submission"] == "diff --git a/x b/x\n+y\n"

    env = OrchardEnvironment(sandbox=sandbox, cwd="/tmp", env={"GREETING": "hi"}, interpreter=["python3", "-c"])
    assert env.execute({"command": "import os; print(os.getcwd(), os.environ['GREETING'])"}, timeout=30) == {
        "output": "/tmp hi\n", "returncode": 0, "exception_info": ""}


def test_sandbox_failures_raise_and_bad_settings_are_refused(sandbox):
    env = OrchardEnvironment(sandbox=sandbox)
    with pytest.raises(NotADirectory, match="/nonexistent"):
        env.execute({"command": "pwd"}, cwd="/nonexistent")
    with pytest.raises(TypeError, match="'command'"):
        env.execute(["ls"])
    with pytest.raises(ValueError, match=r"needs a sandbox, a client or config\.orchestrator_url"):
        OrchardEnvironment()
    with pytest.raises(ValueError, match="sandbox_spec describes a sandbox this environment creates"):
        OrchardEnvironment(sandbox=sandbox, sandbox_spec={"memory": "1Gi"})
    with pytest.raises(ValidationError, match="image"):
        OrchardEnvironment(sandbox=sandbox, image="python:3.11")  # a docker setting: unknown here
    with pytest.raises(ValidationError, match="timeout"):
        OrchardEnvironment(sandbox=sandbox, timeout=0)


def test_an_environment_that_owns_its_sandbox_renders_minis_default_prompts(client):
    """``mini.yaml`` prints the machine's uname into the prompt: the sandbox's, not the host's."""
    config = load_config("mini")
    model = DeterministicToolcallModel(outputs=[tool_turn("Done.", "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT")],
                                       observation_template=config["model"]["observation_template"])
    with OrchardEnvironment(client=client, sandbox_spec=SPEC) as env:
        sandbox_id = env.sandbox.id
        uname = env.get_template_vars()
        assert uname["system"] == "Linux" and uname["node"] == env.sandbox.exec("uname -n").stdout.strip()
        assert uname["node"] != platform.node()
        agent = DefaultAgent(model, env, **config["agent"])
        assert agent.run("Say you are done.") == {"exit_status": "Submitted", "submission": ""}
        system_information = f"{uname['system']} {uname['release']} {uname['version']} {uname['machine']}"
        assert system_information in agent.messages[1]["content"]
        assert agent.serialize()["info"]["config"]["sandbox"]["id"] == sandbox_id
    with pytest.raises(SandboxNotFound):
        client.get(sandbox_id)


SOLVE = [
    text_turn("First see which tests fail.", "python -m pytest -q 2>&1 | tail -n 5"),
    text_turn("Subtraction is wrong; find where operators are evaluated.", f"grep -n -A1 'op == \"-\"' {EVALUATOR}"),
    text_turn("The '-' branch adds. Fix it and rerun the tests.",
              f"sed -i '/op == \"-\"/{{n;s/left + right/left - right/}}' {EVALUATOR} && python -m pytest -q"),
    text_turn("All tests pass. Write the patch.", f"git diff -- {EVALUATOR} > patch.txt && cat patch.txt"),
    text_turn("The patch is right. Submit.", "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT && cat patch.txt"),
]


def test_mini_swe_agent_solves_a_task_and_orchard_grades_it_resolved(client, instance):
    config = load_config("swebench_backticks")
    model = DeterministicModel(outputs=SOLVE, observation_template=config["model"]["observation_template"])
    run = run_swe_instance(client, instance, model, config=config, sandbox_spec=SPEC)

    seen = observations(run.record)
    assert "failed" in seen[0] and "<returncode>0</returncode>" in seen[0]
    assert "left + right" in seen[1]
    assert "<returncode>0</returncode>" in seen[2] and " passed" in seen[2] and "failed" not in seen[2]
    assert run.exit_status == "Submitted"
    assert "-        return left + right" in run.submission and "+        return left - right" in run.submission
    assert run.grade is not None and run.grade.resolved, run.grade.log[-2000:]
    assert {t.test for t in run.grade.tests if t.passed} == set(instance.FAIL_TO_PASS + instance.PASS_TO_PASS)

    record = run.record
    assert record["trajectory_format"] == "mini-swe-agent-1.1" and record["messages"][-1]["role"] == "exit"
    assert record["info"]["config"]["environment"]["cwd"] == "/testbed"
    assert record["info"]["config"]["environment_type"].endswith("mini_swe_agent.OrchardEnvironment")

    trajectory = run.trajectory
    assert trajectory.harness == "mini-swe-agent" and trajectory.policy == "deterministic"
    assert trajectory.task_id == instance.instance_id
    assert [m.role for m in trajectory.messages] == ["system", "user", *["assistant", "user"] * 4, "assistant"]
    assert trajectory.num_actions == len(SOLVE)
    assert trajectory.outcome.model_dump() == {"reward": 1.0, "resolved": True, "status": "completed"}
    assert trajectory.metadata["submission"] == run.submission and trajectory.metadata["exit_status"] == "Submitted"
    assert trajectory.metadata["grade"]["fail_to_pass_passed"] == len(instance.FAIL_TO_PASS)


def test_a_careless_fix_submitted_with_tool_calls_is_not_resolved(client, instance):
    """2.x's default format: parallel bash tool calls answered by tool messages."""
    config = load_config("swebench")
    outputs = [
        tool_turn("Look at the operators and the tests.", f"grep -n -A1 'op == \"-\"' {EVALUATOR}", "ls tests"),
        tool_turn("Swap the plus for a minus.",  # no address: the '+' branch becomes a subtraction too
                  f"sed -i 's/left + right/left - right/' {EVALUATOR} && python -m pytest -q 2>&1 | tail -n 3"),
        tool_turn("Write the patch.", f"git diff -- {EVALUATOR} > patch.txt"),
        tool_turn("Submit.", "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT && cat patch.txt"),
    ]
    model = DeterministicToolcallModel(outputs=outputs, observation_template=config["model"]["observation_template"])
    run = run_swe_instance(client, instance, model, config=config, sandbox_spec=SPEC)

    assert run.exit_status == "Submitted" and run.submission.count("+        return left - right") == 2
    assert run.grade is not None and not run.grade.resolved and run.grade.reason is None
    assert {t.test for t in run.grade.tests if not t.passed} & set(instance.PASS_TO_PASS)
    trajectory = run.trajectory
    assert [m.role for m in trajectory.messages] == [
        "system", "user", "assistant", "tool", "tool", "assistant", "tool", "assistant", "tool", "assistant"]
    first_call, second_call = trajectory.messages[2].tool_calls
    assert first_call.name == "bash" and second_call.arguments == {"command": "ls tests"}
    assert [m.tool_call_id for m in trajectory.messages[3:5]] == [first_call.id, second_call.id]
    assert "test_calculate.py" in trajectory.messages[4].content
    assert trajectory.outcome.model_dump() == {"reward": 0.0, "resolved": False, "status": "completed"}


def test_a_run_past_its_step_limit_is_truncated_and_not_resolved(client, instance):
    config = load_config("swebench_backticks")
    config["agent"]["step_limit"] = 2
    model = DeterministicModel(outputs=SOLVE, observation_template=config["model"]["observation_template"])
    run = run_swe_instance(client, instance, model, config=config, sandbox_spec=SPEC)

    assert run.exit_status == "LimitsExceeded" and run.submission == ""
    assert run.grade is not None and not run.grade.resolved
    assert {t.test for t in run.grade.tests if not t.passed} == set(instance.FAIL_TO_PASS)
    assert run.trajectory.num_actions == 2
    assert run.trajectory.outcome.model_dump() == {"reward": 0.0, "resolved": False, "status": "truncated"}


def test_a_model_that_fails_mid_run_gives_an_aborted_ungraded_trajectory(client, instance):
    config = load_config("swebench_backticks")
    model = DeterministicModel(outputs=SOLVE[:1], observation_template=config["model"]["observation_template"])
    run = run_swe_instance(client, instance, model, config=config, sandbox_spec=SPEC)  # 2nd query: IndexError

    assert run.exit_status == "IndexError" and run.grade is None and run.submission == ""
    assert "list index out of range" in run.record["info"]["exception_str"]
    assert run.record["messages"][-1]["role"] == "exit"
    assert run.trajectory.num_actions == 1
    assert run.trajectory.outcome.model_dump() == {"reward": 0.0, "resolved": False, "status": "aborted"}
    assert run.trajectory.metadata["error"] == "IndexError: list index out of range"
