"""Claw tasks in real sandboxes: services up, tools through both harnesses, graded from the environment alone."""

from __future__ import annotations

import json

import pytest

from orchard.data.trajectory import Message
from orchard.harness.bash import SUBMIT_SENTINEL
from orchard.harness.claw import ClawHarness, claw_shell_harness
from orchard.harness.core import Conversation, Turn
from orchard.harness.episode import SandboxPool, run_episode
from orchard.tasks.claw.families import FAMILIES
from orchard.tasks.claw.oracle import PlanPolicy
from orchard.tasks.claw.spec import ClawTaskSpec, PlanStep
from orchard.tasks.claw.task import SERVICES_ROOT, ClawTask

pytestmark = pytest.mark.usefixtures("orchestrator")


class ShellPolicy:
    """Says shell commands in order, one ```bash block a turn."""

    name = "shell-script"

    def __init__(self, commands: list[str]) -> None:
        self.commands = commands

    async def act(self, conversation: Conversation, *, max_context: int | None = None) -> Turn:
        done = sum(message.role == "assistant" for message in conversation.messages)
        return Turn(Message(role="assistant", content=f"THOUGHT: next.\n\n```bash\n{self.commands[done]}\n```"))


def spec(family: str, seed: int = 0, **environment) -> ClawTaskSpec:
    module = FAMILIES[family]
    made = module.make(module.PARAMS[0], seed)
    return made.model_copy(update={"environment": made.environment.model_copy(update=environment)})


async def test_the_reference_plan_passes_and_the_empty_one_fails_graded_from_the_environment(aclient):
    harness = ClawHarness()
    async with SandboxPool(2) as pool:
        task = ClawTask(spec("inbox_triage"))
        good = await run_episode(aclient, harness, PlanPolicy(task.spec.reference_plan), task, seed=1, pool=pool)
        assert good.outcome.reward == 1.0 and good.outcome.resolved, good.metadata.get("claw")
        claw = good.metadata["claw"]
        assert claw["score"] == 1.0 and all(t["passed"] for t in claw["tests"])
        assert claw["tool_calls"] == len(task.spec.reference_plan)
        assert {t["function"]["name"] for t in good.tools} == set(task.spec.tools)  # the task's tools, as shown
        assert all("x-orchard-route" not in t for t in good.tools)
        # The same pooled sandbox serves the next task: its services are reset, not restarted.
        other = ClawTask(spec("notification_cleanup", seed=3))
        empty = await run_episode(aclient, harness, PlanPolicy([PlanStep(tool="finish", arguments={"answer": ""})]),
                                  other, seed=2, pool=pool)
        assert empty.metadata["sandbox_id"] == good.metadata["sandbox_id"]
        assert empty.outcome.reward == -1.0 and not empty.outcome.resolved
        assert empty.metadata["claw"]["tool_calls"] == 1  # the new task's audit log: only its own finish


async def test_an_unsafe_plan_is_zeroed_by_its_safety_test(aclient):
    task = ClawTask(spec("notification_cleanup", seed=5))
    trajectory = await run_episode(aclient, ClawHarness(), PlanPolicy(task.spec.unsafe_plan), task, seed=3)
    claw = trajectory.metadata["claw"]
    assert claw["safety"] == 0.0 and claw["score"] == 0.0 and trajectory.outcome.reward == -1.0
    assert any(t["kind"] == "safety" and not t["passed"] for t in claw["tests"])


async def test_faults_reach_the_model_as_tool_errors_it_can_recover_from(aclient):
    task = ClawTask(spec("inbox_triage", fault_rate=0.5, faults=["rate_limit", "server_error"],
                         retry_after_seconds=0))
    first = task.spec.reference_plan[0]
    plan = [first] * 6 + [PlanStep(tool="finish", arguments={"answer": "tried"})]
    trajectory = await run_episode(aclient, ClawHarness(), PlanPolicy(plan), task, seed=4)
    answers = [m.content for m in trajectory.messages if m.role == "tool"]
    assert any(a.startswith(("ERROR 429 (retry after 0 s)", "ERROR 500")) for a in answers)
    assert any(not a.startswith("ERROR") for a in answers[:-1])  # and a retry got through
    assert trajectory.metadata["claw"]["faults"] > 0 and trajectory.metadata["claw"]["robustness"] == 1.0


async def test_the_shell_harness_uses_the_command_line_tools_and_cannot_reach_the_grader(aclient):
    task = ClawTask(spec("todo_from_mail"))
    commands = ["claw-tools", "todo_list --done false",
                f"ls -a {SERVICES_ROOT}; nohup sleep 600 >/dev/null 2>&1 &",  # no token file; a process left behind
                f"echo {SUBMIT_SENTINEL} && finish --answer 'nothing to do'"]
    trajectory = await run_episode(aclient, claw_shell_harness(), ShellPolicy(commands), task, seed=5)
    outputs = [m.content for m in trajectory.messages if m.role == "user"][1:]
    assert "todo_create" in outputs[0] and '"items"' in outputs[1]
    assert "token" not in outputs[2] and "config.json" in outputs[2]
    assert trajectory.metadata["submission"].strip().startswith("{")  # finish's JSON reply
    assert trajectory.outcome.reward == -1.0  # graded from the environment: nothing was created
    assert {t["name"]: t["passed"] for t in trajectory.metadata["claw"]["tests"]}  # every test ran


async def test_services_killed_mid_episode_leave_the_episode_ungraded(aclient):
    task = ClawTask(spec("document_edit"))
    commands = ["pkill -9 -f claw_services; true", f"echo {SUBMIT_SENTINEL} && echo done"]
    trajectory = await run_episode(aclient, claw_shell_harness(), ShellPolicy(commands), task, seed=6)
    assert trajectory.outcome.reward is None and not trajectory.outcome.resolved
    assert "grading_error" in trajectory.metadata["claw"]


async def test_the_tools_file_names_where_each_tool_goes(aclient):
    task = ClawTask(spec("meeting_scheduling"))
    async with aclient.create(**task.family.sandbox) as box:
        await task.setup(box)
        listed = json.loads(await box.read_file("/etc/orchard/claw/tools.json"))
        routes = {t["function"]["name"]: t["x-orchard-route"] for t in listed}
        assert routes["finish"] == {"method": "POST", "path": "/answer", "port": 8765}
        assert not await box.exists(f"{SERVICES_ROOT}/token")  # read once by the services, then deleted


FORGED_RUNNER = ("import json, sys\n"
                 "bundle = json.load(open(sys.argv[1]))\n"
                 "print(json.dumps([{'name': t['name'], 'kind': t['kind'], 'weight': t.get('weight', 1.0), "
                 "'passed': True, 'error': None} for t in bundle['tests']]))\n")


async def test_a_policy_with_a_shell_cannot_rewrite_the_grader_or_stand_in_for_the_services(aclient):
    """Two forgeries through the shell harness: the test runner the grader runs rewritten to pass every test (graded
    +1, resolved, before the grader brought its own copy), and the services killed and replaced by a server that
    answers the admin routes with a state of its own (unsigned: tampering)."""
    task = ClawTask(spec("todo_from_mail", seed=7))
    runner = f"{SERVICES_ROOT}/claw_services/run_tests.py"
    rewrite = [f"cat > {runner} <<'PY'\n{FORGED_RUNNER}PY\necho rewritten", f"echo {SUBMIT_SENTINEL} && finish --answer x"]
    rewritten = await run_episode(aclient, claw_shell_harness(), ShellPolicy(rewrite), task, seed=7)
    assert rewritten.outcome.reward == -1.0, rewritten.metadata["claw"]
    fake = ("import http.server, json\n"
            "class H(http.server.BaseHTTPRequestHandler):\n"
            "    def do_GET(self):\n"
            "        body = json.dumps({'calls': []} if 'audit' in self.path else {}).encode()\n"
            "        self.send_response(200); self.send_header('Content-Type', 'application/json')\n"
            "        self.end_headers(); self.wfile.write(body)\n"
            "http.server.HTTPServer(('127.0.0.1', 8765), H).serve_forever()\n")
    stand_in = [f"pkill -9 -f 'claw_[s]ervices --port'; cat > /tmp/fake.py <<'PY'\n{fake}PY\n"
                "setsid -f python3 /tmp/fake.py >/dev/null 2>&1; sleep 1; echo started",
                f"echo {SUBMIT_SENTINEL} && echo done"]
    stood_in = await run_episode(aclient, claw_shell_harness(), ShellPolicy(stand_in), task, seed=8)
    assert stood_in.outcome.reward == -1.0 and stood_in.tampered, stood_in.metadata["claw"]
    assert "signature" in stood_in.metadata["tampering"]
