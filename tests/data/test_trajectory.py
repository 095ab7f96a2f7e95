"""Trajectory schema, crash-safe JSONL storage and the foreign readers."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap

import pytest

from orchard.data.trajectory import (
    Message,
    Outcome,
    ReadReport,
    Trajectory,
    TrajectoryFormatError,
    TrajectoryWriter,
    load_trajectory,
    read_trajectories,
    save_trajectories,
)
from tests.conftest import wait_until


def make(task: str = "t1", actions: int = 2, resolved: bool = False) -> Trajectory:
    messages = [Message(role="system", content="You fix bugs."), Message(role="user", content="Fix it.")]
    for step in range(actions):
        messages.append(Message(role="assistant", content=f"step {step}", token_ids=[5, 6, step], logprobs=[-0.1] * 3))
        messages.append(Message(role="tool", content=f"out {step}", tool_call_id=f"c{step}"))
    return Trajectory(task_id=task, harness="test", policy="p", messages=messages,
                      outcome=Outcome(reward=float(resolved), resolved=resolved, status="completed"))


def test_round_trip(tmp_path):
    path = str(tmp_path / "runs.jsonl")
    written = [make("a"), make("b", resolved=True)]
    with TrajectoryWriter(path) as writer:
        for trajectory in written:
            writer.write(trajectory)
    assert list(read_trajectories(path)) == written


def test_save_trajectories_replaces_a_killed_runs_partial_file(tmp_path):
    path = str(tmp_path / "eval.jsonl")
    with open(path + ".partial", "w") as handle:  # what a run killed mid-write leaves
        handle.write(make("stale").model_dump_json() + "\n" + '{"task_id": "torn')
    save_trajectories(path, [make("a"), make("b")])
    assert [t.task_id for t in read_trajectories(path)] == ["a", "b"]
    assert not os.path.exists(path + ".partial")


def test_schema_checks_steps():
    with pytest.raises(ValueError, match="one entry per state"):
        Trajectory.model_validate({**make(actions=2).model_dump(), "values": [0.1, 0.2]})
    with pytest.raises(ValueError, match="outside actions"):
        Trajectory.model_validate({**make(actions=2).model_dump(), "rise_segments": [(1, 2)]})
    with pytest.raises(ValueError, match="same length"):
        Message(role="assistant", content="x", token_ids=[1, 2], logprobs=[-1.0])


def test_a_writer_killed_mid_run_loses_no_complete_record(tmp_path):
    path = str(tmp_path / "killed.jsonl")
    script = textwrap.dedent(f"""
        from tests.data.test_trajectory import make
        from orchard.data.trajectory import TrajectoryWriter
        writer = TrajectoryWriter({path!r})
        n = 0
        while True:
            t = make(f"task-{{n}}", actions=50)
            writer.write(t)
            n += 1
    """)
    process = subprocess.Popen([sys.executable, "-c", script], cwd=os.getcwd())
    try:
        wait_until(lambda: os.path.exists(path) and os.path.getsize(path) > 2_000_000, timeout=60, what="records")
    finally:
        process.send_signal(signal.SIGKILL)
        process.wait()
    report = ReadReport()
    records = list(read_trajectories(path, report))
    assert len(records) > 10
    assert [r.task_id for r in records] == [f"task-{n}" for n in range(len(records))]
    assert all(r.num_actions == 50 for r in records)
    with TrajectoryWriter(path) as writer:  # a new writer continues the file
        writer.write(make("after"))
    assert [r.task_id for r in read_trajectories(path)][-1] == "after"


def test_a_torn_last_line_is_reported_skipped_and_set_aside(tmp_path):
    path = str(tmp_path / "torn.jsonl")
    with TrajectoryWriter(path) as writer:
        writer.write(make("whole"))
    line = make("torn").model_dump_json()
    with open(path, "a") as handle:
        handle.write(line[: len(line) // 2])  # what a writer killed mid-record leaves
    report = ReadReport()
    assert [r.task_id for r in read_trajectories(path, report)] == ["whole"]
    assert report.torn_line == 2 and "torn" in report.notes[0]
    with TrajectoryWriter(path) as writer:
        writer.write(make("next"))
    assert [r.task_id for r in read_trajectories(path)] == ["whole", "next"]
    with open(path + ".torn") as aside:
        assert aside.read() == line[: len(line) // 2] + "\n"  # nothing is lost


def test_a_malformed_line_is_an_error_naming_it(tmp_path):
    path = tmp_path / "bad.jsonl"
    good = make().model_dump_json()
    path.write_text(good + "\n{oops\n" + good + "\n")
    with pytest.raises(TrajectoryFormatError, match=r"bad.jsonl:2: not JSON"):
        list(read_trajectories(str(path)))
    record = json.loads(good)
    record["messages"][2]["role"] = "robot"
    path.write_text(good + "\n" + json.dumps(record) + "\n")
    with pytest.raises(TrajectoryFormatError, match=r"bad.jsonl:2: messages.2.role"):
        list(read_trajectories(str(path)))


def test_mini_swe_agent_trajectories():
    record = {
        "trajectory_format": "mini-swe-agent-1.1",
        "info": {"exit_status": "Submitted", "submission": "diff --git a/x b/x", "mini_version": "1.9.0",
                 "model_stats": {"instance_cost": 0.1, "api_calls": 2},
                 "config": {"model": {"model_name": "openai/qwen3"}}},
        "messages": [
            {"role": "system", "content": "You are a helpful assistant."},
            {"role": "user", "content": "Fix the bug in calc.py"},
            {"role": "assistant", "content": "THOUGHT: look\n```bash\ncat calc.py\n```"},
            {"role": "user", "content": "<returncode>0</returncode><output>def add(a, b): return a - b</output>"},
            {"role": "assistant", "content": "```bash\nsed -i 's/a - b/a + b/' calc.py\n```",
             "extra": {"response": {}}},
            {"role": "exit", "content": "", "extra": {"exit_status": "Submitted"}},
        ],
    }
    trajectory = load_trajectory(record, task_id="calc-1", outcome=Outcome(resolved=True, reward=1.0))
    assert trajectory.harness == "mini-swe-agent" and trajectory.policy == "openai/qwen3"
    assert [m.role for m in trajectory.messages] == ["system", "user", "assistant", "user", "assistant"]
    assert trajectory.num_actions == 2 and trajectory.outcome.resolved and trajectory.task_id == "calc-1"
    assert trajectory.metadata["submission"].startswith("diff")
    limited = load_trajectory({**record, "info": {**record["info"], "exit_status": "LimitsExceeded"}})
    assert limited.outcome.status == "truncated" and not limited.outcome.resolved


def test_openai_message_lists(tmp_path):
    messages = [
        {"role": "user", "content": [{"type": "text", "text": "List files"}]},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "bash", "arguments": '{"command": "ls"}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "a.py"},
        {"role": "assistant", "content": "One file.", "reasoning_content": "Done."},
    ]
    path = tmp_path / "proxy.jsonl"
    path.write_text(json.dumps(messages) + "\n" + json.dumps({"messages": messages, "task_id": "x"}) + "\n")
    first, second = read_trajectories(str(path))
    assert first.task_id == "proxy.jsonl:1" and second.task_id == "x"
    assert first.messages[0].content == "List files"
    assert first.messages[1].tool_calls[0].arguments == {"command": "ls"}
    assert first.messages[3].reasoning == "Done."
