"""The data step of credit-assignment SFT: trajectories -> values and rise segments -> examples.

Trajectories come from ``config.data.trajectories`` (any format :mod:`orchard.data.trajectory`
reads) or, when that is empty, from the synthetic bug-fix set (:mod:`orchard.tasks.swe.synthetic`),
whose unresolved runs are annotated by the rule-based estimator. Unresolved trajectories read from
a file must already carry values or rise segments (``orchard.data.rise.annotate`` with an
``LLMJudge``).
"""

from __future__ import annotations

import logging
import os
import random

from ml_collections import ConfigDict

from orchard.data.chat import Qwen3Format
from orchard.data.examples import write_examples
from orchard.data.rise import BugLocationEstimator, annotate
from orchard.data.tokenizer import Tokenizer
from orchard.data.trajectory import Trajectory, read_trajectories
from orchard.models.shipped import resolve
from orchard.tasks.swe.synthetic import make_tasks, teacher_trajectory

log = logging.getLogger(__name__)


def synthetic_trajectories(count: int, seed: int, epsilon: float) -> list[Trajectory]:
    """One resolved and one unresolved scripted run per synthetic task, with rule-based values."""
    trajectories = []
    for task in make_tasks(count, seed=seed):
        estimator = BugLocationEstimator(task.path, task.buggy, task.line_number)
        for resolved in (True, False):
            trajectories.append(annotate(teacher_trajectory(task, resolved), estimator, epsilon))
    return trajectories


def build_sft_data(config: ConfigDict, workdir: str) -> tuple[str, str]:
    """Write ``train.jsonl`` and ``eval.jsonl`` examples under ``workdir/data``; return their paths.

    The split is by task, so no task is in both. Tool calls use the Hermes/Qwen3 syntax
    (:class:`~orchard.data.chat.Qwen3Format`) over whichever vocabulary ``data.tokenizer`` names.
    """
    data = config.data
    if data.trajectories:
        trajectories = list(read_trajectories(data.trajectories))
    else:
        trajectories = synthetic_trajectories(data.synthetic_tasks, config.seed, data.epsilon)
    tokenizer = Tokenizer.from_pretrained(resolve(data.tokenizer))
    chat = Qwen3Format(tokenizer)
    tasks = sorted({t.task_id for t in trajectories})
    random.Random(config.seed).shuffle(tasks)
    held_out = set(tasks[: max(1, int(len(tasks) * data.eval_fraction))])
    directory = os.path.join(workdir, "data")
    train, evaluation = os.path.join(directory, "train.jsonl"), os.path.join(directory, "eval.jsonl")
    n_train = write_examples((t for t in trajectories if t.task_id not in held_out), chat, train,
                             data.observation_weight)
    n_eval = write_examples((t for t in trajectories if t.task_id in held_out), chat, evaluation)  # actions only
    resolved = sum(t.outcome.resolved for t in trajectories)
    log.info("%d trajectories (%d resolved) -> %d train and %d eval examples in %s", len(trajectories), resolved,
             n_train, n_eval, directory)
    return train, evaluation
