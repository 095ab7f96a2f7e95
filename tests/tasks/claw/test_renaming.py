"""Renamed copies of Claw episodes: every word a task's invented cast made up is replaced, consistently, and
only tasks that invented a cast have copies."""

from __future__ import annotations

import json
import re

from orchard.data.trajectory import Message, ToolCall, Trajectory
from orchard.tasks.claw.families import FAMILIES
from orchard.tasks.claw.renaming import renamed_episodes
from orchard.tasks.claw.spec import ClawTaskSpec

QUICK = FAMILIES["quick_action"]


def episode(spec: ClawTaskSpec) -> Trajectory:
    """An episode of ``spec`` as the teacher's read: the request, the reference plan's calls, and the fixtures
    as a tool's answer."""
    calls = [ToolCall(id=f"call_{i}", name=step.tool, arguments=step.arguments)
             for i, step in enumerate(spec.reference_plan)]
    return Trajectory(id=f"episode-{spec.id}", task_id=spec.id, messages=[
        Message(role="user", content=spec.prompt),
        Message(role="tool", content=json.dumps(spec.fixtures), tool_call_id="call_0"),
        Message(role="assistant", tool_calls=calls)])


def text(run: Trajectory) -> str:
    """The episode's words: its messages and calls, JSON strings' escaped newlines as spaces."""
    return " ".join(m.content + json.dumps([c.arguments for c in m.tool_calls])
                    for m in run.messages).replace("\\n", " ")


def made_up_words(spec: ClawTaskSpec) -> list[str]:
    """The names and projects the task's cast made up that its episode shows (capitalised and lower case)."""
    cast = QUICK._opening(spec.params, spec.seed)[2]
    words = [*cast.first_names, *cast.last_names, *cast.projects]
    shown = text(episode(spec))
    return [w for word in words for w in (word, word.lower()) if re.search(rf"\b{w}\b", shown)]


def test_a_renamed_episode_shows_none_of_its_casts_words_and_renames_each_the_same_way():
    made = [QUICK.make({"action": action, "wording": 0, "cast": "invented"}, seed)
            for action in QUICK.ACTION_NAMES for seed in (3, 4)]
    specs = {f"quick_action-{i:04d}": spec.model_copy(update={"id": f"quick_action-{i:04d}"})
             for i, spec in enumerate(made)}
    runs = [episode(spec) for spec in specs.values()]
    copies = renamed_episodes(runs, specs, seed=0, copies=2)
    assert len(copies) == 2 * len(runs)
    for run in runs:
        old_words = made_up_words(specs[run.task_id])
        assert old_words  # every action's episode shows some: a name, a title or a subject
        mine = [c for c in copies if c.task_id == run.task_id]
        assert [c.id for c in mine] == [f"{run.id}-renamed0", f"{run.id}-renamed1"]
        for copy in mine:
            renamed = text(copy)
            assert not [w for w in old_words if re.search(rf"\b{w}\b", renamed)]
            # the same shape: only the made-up words changed, so the words around them are kept
            assert re.sub(r"[A-Za-z]+", "w", renamed).count("w") == re.sub(r"[A-Za-z]+", "w", text(run)).count("w")
        assert text(mine[0]) != text(mine[1])  # each copy its own cast
    contact = next(spec for spec in specs.values() if spec.params["action"] == "contact_email")
    copy = next(c for c in copies if c.task_id == contact.id)
    answer = next(step for step in contact.reference_plan if step.tool == "finish").arguments["answer"]
    name = re.search(r"\b([A-Z][a-z]+) ([A-Z][a-z]+)\b", copy.messages[0].content).groups()  # the new name asked for
    assert f"{name[0]}.{name[1]}".lower() in text(copy) and answer not in text(copy)  # its address renamed alike
    assert renamed_episodes(runs, specs, seed=0, copies=2) == copies  # seeded
    assert renamed_episodes(runs, specs, seed=0, copies=1, first=1) == copies[1::2]  # copy indices from `first`


def test_tasks_with_a_real_cast_or_of_other_families_have_no_copies():
    real = QUICK.make({"action": "add_todo", "wording": 0, "cast": "real"}, 0)
    triage = FAMILIES["inbox_triage"].make(FAMILIES["inbox_triage"].PARAMS[0], 0)
    runs = [episode(real), episode(triage), Trajectory(task_id="unknown-1", messages=[])]
    assert renamed_episodes(runs, {real.id: real, triage.id: triage}, seed=0, copies=3) == []
