"""Teacher collection with the oracle teacher through both real harnesses, in real sandboxes."""

from __future__ import annotations

import asyncio
import re

import pytest

from orchard.data.trajectory import Outcome, Trajectory
from orchard.env import AsyncSandboxClient
from orchard.harness.bash import BashHarness
from orchard.harness.codeact import CodeActHarness
from orchard.tasks.swe.candidates import REPAIR_TOOL_HELP
from orchard.tasks.swe.collect import collect, drop_reason, make_teacher
from orchard.tasks.swe.diffs import parse_patch
from orchard.tasks.swe.generate import generate_task_set
from orchard.tasks.swe.oracle import OracleTeacher, buggy_line
from orchard.tasks.swe.skills import ProceduralConfig
from orchard.tasks.swe.sources import resolve_source
from orchard.tasks.swe.task import swe_tasks
from orchard.tasks.swe.taskset import TaskSetConfig, make_task_set


@pytest.fixture(scope="module")
def instances(tmp_path_factory):
    out = tmp_path_factory.mktemp("swe_tasks")
    tasks, _ = generate_task_set([resolve_source("minicalc"), resolve_source("textkit")], 2, str(out), seed=1,
                                 tests_visible=True)
    assert len(tasks) == 2
    return tasks


def test_parse_patch_reads_the_gold_hunks(instances):
    for instance in instances:
        [hunk, *_] = parse_patch(instance.patch)
        assert hunk.old != hunk.new and hunk.path.endswith(".py")
    with pytest.raises(ValueError, match="no hunks"):
        parse_patch("not a diff")


def test_the_oracle_resolves_through_both_harnesses_and_its_failing_variant_does_not(orchestrator, instances):
    async def run():
        client = AsyncSandboxClient(orchestrator.base_url, api_key=orchestrator.api_key)
        try:
            report = await collect(client, swe_tasks(instances), [BashHarness(), CodeActHarness()],
                                   make_teacher(variants=("recover", "fail", "unverified")), samples=3,
                                   concurrency=3, progress=False)
            left = await client.list()
        finally:
            await client.aclose()
        return report, left

    report, left = asyncio.run(run())
    assert not report.errors and not report.dropped and len(report.kept) == 12
    used = {t.metadata["sandbox_id"] for t in report.kept}
    assert len(used) == 12 and not used & {info.id for info in left}  # every sandbox deleted
    for trajectory in report.kept:
        variant = trajectory.policy.removeprefix("oracle-")
        assert trajectory.outcome.status == "completed" and trajectory.metadata["end_reason"] == "submitted"
        assert trajectory.outcome.resolved == (variant == "recover"), (trajectory.task_id, trajectory.harness, variant)
        observations = [m.content for m in trajectory.messages if m.role in ("tool", "user")][1:]
        runs = [text for text in observations if " passed" in text or " failed" in text]  # real test runs
        # it reproduces the failure; recover and fail verify their edit (recover twice: wrong, then right)
        assert len(runs) == {"recover": 3, "fail": 2, "unverified": 1}[variant], (variant, observations)
        assert "failed" in runs[0] and ("failed" in runs[-1]) == (variant != "recover")
        if trajectory.harness == "codeact":
            assert all(m.tool_calls for m in trajectory.messages if m.role == "assistant")
        if variant != "recover":  # credit goes to localising the bug, not to the wrong edit that follows
            edit = trajectory.num_actions - {"fail": 3, "unverified": 2}[variant]
            assert trajectory.rise_segments and all(last < edit for _, last in trajectory.rise_segments)
    summary = report.summary()
    assert summary["resolved"] == 4 and summary["unresolved"] == 8 and summary["by_harness"] == {"bash": 6, "codeact": 6}


def test_the_papers_filters():
    def run(**metadata) -> Trajectory:
        status = metadata.pop("status", "completed")
        return Trajectory(task_id="t", messages=[], outcome=Outcome(status=status), metadata=metadata)

    assert drop_reason(run(end_reason="submitted", format_errors=0)) is None
    assert drop_reason(run(end_reason="token_limit", status="truncated")) == "over_token_limit"
    assert drop_reason(run(end_reason="submitted", format_errors=2)) == "format_errors"
    assert drop_reason(run(end_reason="time_limit", status="timed_out")) == "timed_out"


def test_the_brief_plan_searches_reads_edits_and_submits(tmp_path):
    [instance], _ = generate_task_set([resolve_source("opkit")], 1, str(tmp_path), seed=0, tests_visible=True,
                                      kinds=("swap_operator",))
    teacher = OracleTeacher(instance, "bash", brief=True)
    assert teacher.name == "oracle-clean-brief"
    [search, read, edit, submit] = teacher.plan
    assert search.tool == "search" and search.arguments["symbol"].startswith("def ") and read.tool == "view"
    assert "pytest" not in " ".join(str(step.arguments) for step in teacher.plan)
    [hunk] = parse_patch(instance.patch)
    name = re.search(r"def (\w+)", hunk.section or "\n".join(hunk.old)).group(1)
    fixed = next(line for line in hunk.new if line not in hunk.old)
    number, wrong = buggy_line(hunk)
    # The one-line fix is addressed by the enclosing def on its line (a file may define two functions of one
    # name), as `sed -i 'K{/def f(/{n;s/.*/NEW/}}' path`.
    assert edit.arguments["command"] == f"sed -i '{number - 1}{{/def {name}(/{{n;s/.*/{fixed}/}}}}' {hunk.path}"
    # Its thought names the function, quotes the line as `nl -ba` showed it, then says the line the edit writes.
    assert edit.thought == (f"The bug is in `def {name}`, on this line of {hunk.path}:\n{number:>6}\t{wrong}\n"
                            f"It should be `{fixed}`. Fixing it.")
    assert submit.tool == "finish"


def test_the_search_variant_fixes_generated_bugs_by_trying_one_token_changes(orchestrator, tmp_path):
    """Written out in the bash harness, and as the sandbox's repair command where the task offers it, in both
    harnesses; the command refuses an argument that names no function's def with a usage line."""
    config = TaskSetConfig(sources=("procedural",), kinds=("swap_operator", "off_by_one", "invert_condition"),
                           procedural=ProceduralConfig(repos=1, helpers=6, bugs_per_repo=2, held_out_repos=0))
    instances = make_task_set(config, str(tmp_path), seed=0)[:1]
    [with_tool] = swe_tasks(instances, repair_tool=True)
    assert with_tool.prompt.endswith(REPAIR_TOOL_HELP) and REPAIR_TOOL_HELP not in swe_tasks(instances)[0].prompt

    async def run():
        client = AsyncSandboxClient(orchestrator.base_url, api_key=orchestrator.api_key)
        try:
            async with await client.create(**with_tool.family.sandbox) as box:
                await with_tool.setup(box)
                misuse = [await box.exec(command, cwd="/workspace/repo") for command in
                          ("repair", "repair ./nowhere.py:3", f"repair ./{instances[0].metadata['path']}:1")]
            teacher = make_teacher(variants=("search",))
            written = await collect(client, swe_tasks(instances), [BashHarness()], teacher, samples=1, progress=False)
            tool = await collect(client, [with_tool], [BashHarness(), CodeActHarness()], teacher, samples=1,
                                 concurrency=2, progress=False)
            return misuse, written, tool
        finally:
            await client.aclose()

    misuse, written, tool = asyncio.run(run())
    assert [r.exit_code != 0 for r in misuse] == [True] * 3
    assert "usage: repair PATH:LINE" in misuse[0].stderr and "usage: repair PATH:LINE" in misuse[1].stderr
    assert "no def on line 1" in misuse[2].stderr
    assert not written.errors and not tool.errors and len(written.kept) == 1 and len(tool.kept) == 2
    for trajectory in [*written.kept, *tool.kept]:
        assert trajectory.outcome.resolved, (trajectory.task_id, trajectory.harness)
        actions = [m for m in trajectory.messages if m.role == "assistant"]
        observations = [m.content for m in trajectory.messages if m.role in ("tool", "user")][1:]
        # reproduce, find, read, the repair script (or command), rerun, submit
        repair = actions[3].tool_calls[0].arguments["command"] if actions[3].tool_calls else actions[3].content
        expected = (rf"repair \./{re.escape(instances[0].metadata['path'])}:\d+" if trajectory in tool.kept
                    else "<<'PY'")
        assert len(actions) == 6 and re.search(expected, repair), repair
        assert "passes with line " in observations[3] and "passed" in observations[4]
        assert "failed" in observations[0] and "pass now" in str(actions[5].content) + str(actions[5].tool_calls)
