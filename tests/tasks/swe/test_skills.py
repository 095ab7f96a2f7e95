"""The procedural task set's skill splits: no shared gold line, held-out sets disjoint from training by
construction, every kept bug caught by a test and fixed by its gold patch."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest

from orchard.data.trajectory import Message, Trajectory
from orchard.tasks.swe.localtests import run_tests
from orchard.tasks.swe.procedural import repository_nouns
from orchard.tasks.swe.skills import (
    AXES,
    ProceduralConfig,
    gold_line,
    held_out_combos,
    helper_of,
    procedural_specs,
    renamed_runs,
    split_by_skill,
)
from orchard.tasks.swe.taskset import TaskSetConfig, make_task_set
from orchard.tasks.swe.testlog import passing
from tests.tasks.swe.test_bugs import git_apply

KINDS = ("swap_operator", "change_constant", "off_by_one", "invert_condition", "remove_statement")
CONFIG = ProceduralConfig(repos=3, helpers=8, bugs_per_repo=8, held_out_repos=1, held_out_combos=3,
                          validation_fraction=0.2, instance_fraction=0.2)


@pytest.fixture(scope="module")
def generated(tmp_path_factory):
    directory = tmp_path_factory.mktemp("procedural")
    config = TaskSetConfig(sources=("procedural",), kinds=KINDS, procedural=CONFIG)
    return make_task_set(config, str(directory), seed=0)


def test_every_repository_gives_bugs_tagged_with_their_skill(generated):
    assert len(generated) >= 4 * 6 + 3 * 4  # most of the 8 a repository may keep
    for instance in generated:
        meta = instance.metadata
        assert meta["kind"] in KINDS and meta["operation"] and meta["axis"] in ("train", *AXES)
        assert meta["style"] and meta["vocabulary"] and meta["constants"]
    by_axis = {axis: {i.metadata["source"] for i in generated if i.metadata["axis"] == axis} for axis in AXES}
    assert all(len(sources) == 1 for sources in by_axis.values())


def test_the_skill_split_shares_no_gold_line_and_no_helper_with_training(generated):
    split = split_by_skill(generated, CONFIG, seed=0, rl_fraction=0.3)
    sets = {"sft": split.sft, "rl": split.rl, "validation": split.validation, **split.held_out}
    ids = [i.instance_id for tasks in sets.values() for i in tasks]
    assert len(ids) == len(set(ids))  # no instance in two sets
    lines = [gold_line(i) for tasks in sets.values() for i in tasks]
    assert len(lines) == len(set(lines))  # no two tasks share a gold line
    assert split.dropped["shared_gold_line"] == len(generated) - len({gold_line(i) for i in generated})
    assert all(split.held_out[name] for name in ("combo", *AXES)) and split.sft and split.rl and split.validation
    train = split.sft + split.rl
    # RL never samples a helper of a held-out set or of the validation set; SFT neither, but for `instance`
    excluded = {helper_of(i) for name in ("combo", *AXES) for i in split.held_out[name]} | {
        helper_of(i) for i in split.validation}
    assert not {helper_of(i) for i in train} & excluded
    assert not {helper_of(i) for i in split.rl} & {helper_of(i) for i in split.sft + split.held_out["instance"]}
    assert {helper_of(i) for i in split.held_out["instance"]} <= {helper_of(i) for i in split.sft}
    # a held-out combination is never trained, but its operation and its kind each are, with other partners
    assert {(i.metadata["operation"], i.metadata["kind"]) for i in split.held_out["combo"]} <= set(split.combos)
    training_pairs = {(i.metadata["operation"], i.metadata["kind"]) for i in train + split.validation}
    assert not training_pairs & set(split.combos)
    assert {op for op, _ in split.combos} <= {op for op, _ in training_pairs}
    assert {kind for _, kind in split.combos} <= {kind for _, kind in training_pairs}
    # each held-out repository differs from training in its own axis
    for axis, held in zip(AXES, (CONFIG.held_out_constants, CONFIG.held_out_vocabulary, CONFIG.held_out_style),
                          strict=True):
        assert {i.metadata[axis] for i in split.held_out[axis]} == {held}
        assert held not in {i.metadata[axis] for i in train}


def test_the_split_is_seeded_and_its_combinations_are_spread(generated):
    again = split_by_skill(list(reversed(generated)), CONFIG, seed=0, rl_fraction=0.3)
    first = split_by_skill(generated, CONFIG, seed=0, rl_fraction=0.3)
    assert [i.instance_id for i in again.sft] == [i.instance_id for i in first.sft]
    pairs = [(op, kind) for op in ("arith", "loop", "string", "compose") for kind in KINDS[:4]]
    combos = held_out_combos(3, pairs, seed=0)
    assert len({op for op, _ in combos}) == 3 and len({kind for _, kind in combos}) == 3
    assert "compose" not in {op for op, _ in combos} and set(combos) <= set(pairs)
    assert held_out_combos(3, pairs, seed=1) != combos
    # a pair whose operation or kind occurs nowhere else is never held out: training would not see it at all
    assert held_out_combos(3, [("arith", "off_by_one"), ("loop", "swap_operator")], seed=0) == []


def test_kept_bugs_fail_their_tests_and_their_gold_patches_fix_them(generated, tmp_path):
    for instance in generated[:: max(1, len(generated) // 4)]:
        repo = tmp_path / instance.instance_id
        shutil.copytree(instance.repo_path, repo)
        buggy = run_tests(str(repo), ["tests"])
        assert not passing(buggy.results) & set(instance.FAIL_TO_PASS) and instance.PASS_TO_PASS
        assert set(instance.PASS_TO_PASS) <= passing(buggy.results)
        git_apply(repo, instance.patch)
        fixed = run_tests(str(repo), ["tests"])
        assert set(instance.FAIL_TO_PASS) | set(instance.PASS_TO_PASS) <= passing(fixed.results)
        assert Path(repo, instance.metadata["path"]).read_text().splitlines()[instance.metadata["line"] - 1] == (
            instance.metadata["original_line"])


def test_bad_procedural_settings_are_refused():
    for bad, match in (({"styles": ("modules", "classes")}, "also a training one"),
                       ({"vocabularies": ("ocean",)}, "unknown vocabulary"), ({"repos": 0}, "must be positive")):
        with pytest.raises(ValueError, match=match):
            ProceduralConfig(**bad).check()


def test_renamed_runs_hold_none_of_their_repositorys_names_and_keep_their_task():
    spec = procedural_specs(CONFIG, 0)["train"][0]
    nouns = repository_nouns(spec)
    helper, test = f"fold_{nouns[0]}", f"tests/test_{nouns[1]}s.py"
    run = Trajectory(task_id=f"{spec.name}__swap_operator-1", messages=[
        Message(role="user", content=f"Fix `{helper}` in procedural/{spec.name}: {test} fails"),
        Message(role="assistant", content=f"```bash\ngrep -rn 'def {helper}' src/{spec.name}\n```"),
        Message(role="user", content=f"src/{spec.name}/{nouns[1]}s.py:3:def {helper}({nouns[2]}):")])
    other = Trajectory(task_id="opkit__swap_operator-2", messages=[Message(role="user", content="not generated")])
    copies = renamed_runs([run, other], CONFIG, 0, copies=2)
    assert len(copies) == 2 and {c.task_id for c in copies} == {run.task_id}  # the shipped repository's run: none
    texts = ["\n".join(m.content for m in c.messages) for c in copies]
    for text in texts:
        assert spec.name not in text and not any(noun in text for noun in nouns[:3])
        helper_now = re.search(r"Fix `(fold_[a-z]+)`", text).group(1)
        assert text.count(helper_now) == 3  # the same new name wherever the old one was
    assert texts[0] != texts[1]  # each copy its own names
    assert renamed_runs([run], CONFIG, 0, copies=2) == copies  # seeded
    later = renamed_runs([run], CONFIG, 0, copies=1, first=1)  # copy indices from `first`: the second copy
    assert [c.messages for c in later] == [copies[1].messages] and later[0].id.endswith("renamed1")
