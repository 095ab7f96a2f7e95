"""The data step of credit-assignment SFT: trajectories -> values and rise segments -> examples.

Trajectories come from a file (any format :mod:`orchard.data.trajectory` reads) or, when none is
given, from the synthetic bug-fix set (:mod:`orchard.tasks.swe.synthetic`), whose unresolved runs
are annotated by the rule-based estimator. Unresolved trajectories read from a file must already
carry values or rise segments (``orchard.data.rise.annotate`` with an
:class:`~orchard.eval.judge.LLMJudge`).
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from orchard.data.chat import ChatFormat, make_chat_format
from orchard.data.copying import write_copy_examples
from orchard.data.examples import Unresolved, turn_examples, write_examples
from orchard.data.rise import EPSILON, BugLocationEstimator, annotate
from orchard.data.selection import Selector, select_trajectories
from orchard.data.tokenizer import Tokenizer
from orchard.data.trajectory import Trajectory, read_trajectories
from orchard.data.vision_rows import ImageTable
from orchard.eval.splits import split_by_id
from orchard.seeds import seeded_random
from orchard.tasks.swe.synthetic import make_tasks, teacher_trajectory
from orchard.workdir import write_json

log = logging.getLogger(__name__)


def synthetic_trajectories(count: int, seed: int, epsilon: float) -> list[Trajectory]:
    """One resolved and one unresolved scripted run per synthetic task, with rule-based values."""
    trajectories = []
    for task in make_tasks(count, seed=seed):
        estimator = BugLocationEstimator(task.path, task.buggy, task.line_number)
        for resolved in (True, False):
            trajectories.append(annotate(teacher_trajectory(task, resolved), estimator, epsilon))
    return trajectories


@dataclass(frozen=True)
class ExamplesConfig:
    """How trajectories become SFT examples."""

    seed: int = 0
    chat_format: str = "qwen3"
    eval_fraction: float = 0.125  # of the tasks, held out for the eval loss
    epsilon: float = EPSILON  # the rise-segment threshold
    observation_weight: float = 0.0  # the loss weight of what the model is shown: none, as in the paper
    synthetic_tasks: int = 96  # without trajectories: tasks of the synthetic set (one resolved, one unresolved run)
    # What unresolved trajectories teach: their rise segments (the paper's credit assignment), every action
    # ("whole") or nothing ("drop": resolved-only SFT); the last two are ablations (orchard.data.examples).
    unresolved: Unresolved = "rise"
    # Which training trajectories are used (orchard.data.selection): a rule and the fraction it keeps; and,
    # for matched-token ablation arms, a budget of trained tokens (0: none) filled in a seeded order.
    select: Selector = "all"
    fraction: float = 1.0
    token_budget: float = 0.0
    selection_seed: int = 0  # the selection's and the budget's order (the split into train and eval keeps `seed`)
    # Copies of each teacher run with its names coined anew, so that names are copied, not recalled; 0: none. SWE's
    # generated repositories (orchard.tasks.swe.skills.renamed_runs), Claw's invented casts
    # (orchard.tasks.claw.renaming).
    renamings: int = 0
    # Copying lessons (orchard.data.copying) mixed into the training examples, for a policy trained from scratch:
    # kept in SFT, the copying that the lessons before it taught is not trained away; 0: none.
    copy_lessons: int = 0


def build_examples(config: ExamplesConfig, directory: str, tokenizer: Tokenizer,
                   trajectories: Sequence[Trajectory] | str | None = None,
                   group: Callable[[Trajectory], str] | None = None,
                   lessons: tuple[str, int, int] = ("span", 8, 40)) -> tuple[str, str]:
    """Write ``train.jsonl`` and ``eval.jsonl`` examples into ``directory``, and what they hold into
    ``stats.json``; return the two paths.

    ``trajectories`` is a list, a file of them, or ``None`` for the synthetic set. The split is by
    task (:func:`~orchard.eval.splits.split_by_id`), so no task is in both; eval examples weigh actions
    only and are the same for every ``unresolved``, ``select``, ``fraction`` and ``token_budget``, so
    the eval loss compares ablation arms. The training side is then selected
    (:func:`~orchard.data.selection.select_trajectories`; ``group`` for the ``diverse`` rule) and, with
    a token budget, shuffled by ``selection_seed`` and filled to it. ``config.copy_lessons`` copying lessons
    of the kind and spans ``lessons`` names (:func:`~orchard.data.copying.write_copy_examples`) follow the
    training examples (the pipeline shuffles them together).
    """
    if isinstance(trajectories, str):
        trajectories = list(read_trajectories(trajectories))
    elif trajectories is None:
        trajectories = synthetic_trajectories(config.synthetic_tasks, config.seed, config.epsilon)
    chat = make_chat_format(config.chat_format, tokenizer)
    train, held = split_by_id(trajectories, config.eval_fraction, config.seed, key=lambda t: t.task_id, purpose="sft-eval",
                              at_least_one=True)
    train = select_trajectories(train, config.select, config.fraction, config.selection_seed, group)
    if config.token_budget:
        train = seeded_random(config.selection_seed, "token-budget-order").sample(train, len(train))
    paths = os.path.join(directory, "train.jsonl"), os.path.join(directory, "eval.jsonl")
    written = write_examples(train, chat, paths[0], config.observation_weight, config.unresolved, config.token_budget)
    kind, min_span, max_span = lessons
    lessons_written = write_copy_examples(paths[0], tokenizer, config.copy_lessons, config.seed, min_span, max_span,
                                          "sft-copy-lessons", append=True, kind=kind) if config.copy_lessons else 0
    held_written = write_examples(held, chat, paths[1])
    write_json(os.path.join(directory, "stats.json"), {"train": {**written.to_dict(), "copy_lessons": lessons_written},
                                                       "eval": held_written.to_dict()})
    resolved = sum(t.outcome.resolved for t in trajectories)
    log.info("%d trajectories (%d resolved) -> %d train examples (%d trajectories, %d resolved, %.0f trained tokens; "
             "%d copying lessons) and %d eval examples in %s", len(trajectories), resolved, written.examples,
             written.trajectories, written.resolved, written.trained_tokens, lessons_written, held_written.examples,
             directory)
    return paths


def build_turn_examples(directory: str, trajectories: Sequence[Trajectory], chat_format: ChatFormat,
                        view: Callable[..., Any] | None, table: ImageTable, *, seed: int, eval_fraction: float,
                        max_tokens: int) -> dict[str, Any]:
    """A vision-language policy's examples: every assistant turn of the teacher's trajectories its own example,
    under the ``view`` the policy samples with (:func:`~orchard.data.examples.turn_examples`), into ``train.jsonl``
    and ``eval.jsonl`` (a seeded ``eval_fraction`` of the trajectories), with the image table they point into
    (``images.json``). A turn longer than ``max_tokens`` is left out (truncation would cut it) and counted."""
    order = list(trajectories)
    seeded_random(seed, "sft-eval").shuffle(order)
    held = max(1, round(eval_fraction * len(order))) if eval_fraction else 0
    written, too_long = 0, 0
    for name, part in (("eval", order[:held]), ("train", order[held:])):
        with open(os.path.join(directory, f"{name}.jsonl"), "w") as handle:
            for trajectory in part:
                for example in turn_examples(trajectory, chat_format, view, table):
                    if len(example["token_ids"]) > max_tokens:
                        too_long += 1
                        continue
                    handle.write(json.dumps(example) + "\n")
                    written += 1
    if too_long:
        log.warning("%d SFT examples are longer than %d tokens and were left out", too_long, max_tokens)
    table.save(os.path.join(directory, "images.json"))
    return {"trajectories": len(order), "eval_trajectories": held, "examples": written, "too_long": too_long,
            "images": len(table.refs)}
