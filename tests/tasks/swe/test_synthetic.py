"""Synthetic bug-fix tasks over real source, their scripted trajectories and the SFT data split."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from orchard.data.rise import BugLocationEstimator, annotate
from orchard.recipes.sft_data import synthetic_trajectories
from orchard.tasks.swe.synthetic import FLIPS, make_tasks, teacher_trajectory
from orchard.workdir import read_json


def test_tasks_flip_one_operator_in_a_real_file():
    tasks = make_tasks(5, seed=3)
    assert len(tasks) == 5 and len({t.path for t in tasks}) == 5
    for task in tasks:
        lines = task.source.splitlines()
        assert lines[task.line_number - 1] == task.buggy != task.original
        assert any(task.original.replace(op, flipped, 1) == task.buggy for op, flipped in FLIPS.items())
    assert [t.task_id for t in make_tasks(5, seed=3)] == [t.task_id for t in tasks]  # seeded


def test_unresolved_runs_rise_only_while_localising():
    task = make_tasks(1, seed=0)[0]
    estimator = BugLocationEstimator(task.path, task.buggy, task.line_number)
    fixed = annotate(teacher_trajectory(task, resolved=True), estimator)
    failed = annotate(teacher_trajectory(task, resolved=False), estimator)
    assert fixed.outcome.resolved and fixed.values[-1] == 1.0
    assert not failed.outcome.resolved and failed.values[-1] == 0.0
    edit = 3  # the fourth action edits: the right line when resolved, a wrong one otherwise
    assert any(first <= edit <= last for first, last in fixed.rise_segments)
    assert not any(first <= edit <= last for first, last in failed.rise_segments)
    assert failed.rise_segments and failed.rise_segments[0][0] == 0
    fix = fixed.messages[2 + 2 * edit].tool_calls[0].arguments["command"]
    assert task.original.strip() in fix and f"{task.line_number}s" in fix


def test_sft_data_splits_by_task(tmp_path):
    from orchard.data.tokenizer import Tokenizer
    from orchard.models.shipped import smollm2_gguf
    from orchard.recipes.sft_data import ExamplesConfig, build_examples

    config = ExamplesConfig(synthetic_tasks=8, eval_fraction=0.25)
    train, evaluation = build_examples(config, str(tmp_path), Tokenizer.from_gguf(smollm2_gguf()))
    with open(train) as handle:
        train_examples = [json.loads(line) for line in handle]
    with open(evaluation) as handle:
        eval_examples = [json.loads(line) for line in handle]
    assert len(train_examples) == 12 and len(eval_examples) == 4  # 6 + 2 tasks, a resolved and a failed run each
    assert all(len(e["token_ids"]) == len(e["loss_mask"]) and 0 < sum(e["loss_mask"]) < len(e["loss_mask"])
               for e in train_examples + eval_examples)
    assert len(synthetic_trajectories(3, seed=0, epsilon=0.05)) == 6


def test_copying_lessons_join_the_training_examples_only(tmp_path):
    """``copy_lessons`` appends that many span + span lessons to the training file, counts them, and leaves the
    trajectories' examples and the eval file as they were."""
    from orchard.data.copying import word_pieces
    from orchard.data.tokenizer import Tokenizer
    from orchard.models.shipped import smollm2_gguf
    from orchard.recipes.sft_data import ExamplesConfig, build_examples

    tokenizer = Tokenizer.from_gguf(smollm2_gguf())
    paths = {lessons: build_examples(ExamplesConfig(synthetic_tasks=8, eval_fraction=0.25, copy_lessons=lessons),
                                     str(tmp_path / str(lessons)), tokenizer) for lessons in (0, 5)}
    plain, mixed = ([json.loads(line) for line in Path(paths[n][0]).read_text().splitlines()] for n in (0, 5))
    assert mixed[:len(plain)] == plain and len(mixed) == len(plain) + 5
    pieces = set(word_pieces(tokenizer))
    for lesson in mixed[len(plain):]:
        half = len(lesson["token_ids"]) // 2
        assert lesson["token_ids"][:half] == lesson["token_ids"][half:] and set(lesson["token_ids"]) <= pieces
    assert Path(paths[0][1]).read_text() == Path(paths[5][1]).read_text()
    stats = json.loads((tmp_path / "5" / "stats.json").read_text())["train"]
    assert stats["copy_lessons"] == 5 and stats["examples"] == len(plain)


def test_the_ablation_arms_change_what_failed_runs_teach_and_nothing_else(tmp_path):
    """Resolved-only SFT keeps only the resolved runs' examples; teaching failed runs whole trains more of
    their tokens than their rise segments; the eval examples are the same in every arm."""
    from orchard.data.tokenizer import Tokenizer
    from orchard.models.shipped import smollm2_gguf
    from orchard.recipes.sft_data import ExamplesConfig, build_examples

    tokenizer = Tokenizer.from_gguf(smollm2_gguf())
    arms = {}
    for arm in ("rise", "whole", "drop"):
        config = ExamplesConfig(synthetic_tasks=8, eval_fraction=0.25, unresolved=arm)
        paths = build_examples(config, str(tmp_path / arm), tokenizer)
        arms[arm] = []
        for path in paths:
            with open(path) as handle:
                arms[arm].append([json.loads(line) for line in handle])
    trained = {arm: sum(sum(e["loss_mask"]) for e in train) for arm, (train, _) in arms.items()}
    assert [len(train) for train, _ in arms.values()] == [12, 12, 6]  # 6 tasks: a resolved and a failed run each
    assert trained["drop"] < trained["rise"] < trained["whole"]
    assert arms["rise"][1] == arms["whole"][1] == arms["drop"][1]
    stats = {arm: read_json(str(tmp_path / arm / "stats.json")) for arm in arms}
    assert {arm: s["train"]["trained_tokens"] for arm, s in stats.items()} == pytest.approx(trained)
    assert [stats[arm]["train"]["resolved"] for arm in arms] == [6, 6, 6]  # matched resolved trajectories

    # Matched trained tokens: the rise arm filled, in a seeded order, to resolved-only SFT's token count, so it
    # trades resolved runs for rise segments; the eval examples are still the same.
    budget = stats["drop"]["train"]["trained_tokens"]
    config = ExamplesConfig(synthetic_tasks=8, eval_fraction=0.25, unresolved="rise", token_budget=budget,
                            selection_seed=3)
    _, eval_path = build_examples(config, str(tmp_path / "rise_tokens"), tokenizer)
    matched = read_json(str(tmp_path / "rise_tokens" / "stats.json"))["train"]
    assert budget * 0.8 < matched["trained_tokens"] <= budget
    assert matched["resolved"] < 6 < matched["trajectories"]
    with open(eval_path) as handle:
        assert [json.loads(line) for line in handle] == arms["drop"][1]


def test_a_selection_changes_only_the_training_examples(tmp_path):
    from orchard.data.tokenizer import Tokenizer
    from orchard.models.shipped import smollm2_gguf
    from orchard.recipes.sft_data import ExamplesConfig, build_examples

    tokenizer = Tokenizer.from_gguf(smollm2_gguf())
    stats = {}
    for name, rule, fraction in (("all", "all", 1.0), ("half", "one_per_task", 0.5)):
        build_examples(ExamplesConfig(synthetic_tasks=8, eval_fraction=0.25, select=rule, fraction=fraction),
                       str(tmp_path / name), tokenizer)
        stats[name] = read_json(str(tmp_path / name / "stats.json"))
    assert stats["all"]["train"]["trajectories"] == 12 and stats["half"]["train"]["trajectories"] == 6
    assert stats["half"]["eval"] == stats["all"]["eval"]
