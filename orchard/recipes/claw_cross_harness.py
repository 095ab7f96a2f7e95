"""Cross-harness training on Orchard-Claw: the paper's ReAct -> ZeroClaw table in miniature.

The paper (section 3.5 of the notes) trains its Claw model on trajectories from two harnesses and reports
it on a harness it was not trained in. Here, on the Claw recipe's tasks with one tokenizer for every arm:

* **teacher**: the oracle in harness A (the ReAct harness, tool calls) and harness B (the shell harness,
  one command a turn over the tasks' command-line tools) on every SFT task (:mod:`orchard.recipes.claw`);
* **arms**, SFT at an equal data budget (the same number of teacher episodes, the same steps): ``claw``
  (A only), ``claw-shell`` (B only), ``both`` (A's episodes of a seeded half of the tasks, B's of the
  other half: :func:`~orchard.recipes.cross_harness.arm_trajectories`);
* **evaluation** of every arm on the held-out tasks in A, B and C, a harness none was trained on:
  smolagents' ``CodeAgent`` (:func:`~orchard.harness.claw.claw_smolagents_harness`), its own process,
  calling the arm's policy through ``orchard serve`` and the recording proxy. Each cell is ``eval.samples``
  sampled episodes a task, graded from the services' state: pass^3, pass@3, mean score, safety violations.

The workdir::

    config.json, tasks/, teacher/, tokenizer/      as in the Claw recipe
    arms/<arm>/sft_data, sft/                       each arm's examples and policy
    arms/<arm>/eval/sft_<harness>/                  its held-out episodes and result.json
    summary.json                                    the matrix: arm -> harness -> measure, and the drops

Departures, at this scale: C's prompt is long (smolagents' system prompt is thousands of tokens of the
trained BPE), so the policy's positions are raised for every arm (``model.init``'s
``max_position_embeddings``; RoPE has no learnt positions) though it trains on ``sft.seq_len`` rows.
RL is not run: the arms differ in their SFT data only.
"""

from __future__ import annotations

import asyncio
import logging
import os
from dataclasses import dataclass
from typing import Any

from ml_collections import ConfigDict

from orchard.config import from_config
from orchard.harness.claw import claw_smolagents_harness
from orchard.harness.core import DEFAULT_MAX_TURNS
from orchard.recipes.claw import CLAW, make_harness
from orchard.recipes.cross_harness import matrix_summary, run_arms
from orchard.workdir import write_json

log = logging.getLogger(__name__)
HARNESS_PAIR = ("claw", "claw-shell")  # A and B: the harnesses the teacher runs and the arms train in


@dataclass(frozen=True)
class ClawCrossConfig:
    arms: tuple[str, ...] = ("claw", "claw-shell", "both")
    third_party_max_turns: int = DEFAULT_MAX_TURNS  # smolagents' max_steps
    third_party_concurrency: int = 4
    third_party_wall_clock_s: float = 300.0


async def run_claw_cross_harness(config: ConfigDict, workdir: str, *, rerun: bool = False) -> dict[str, Any]:
    """The teacher in A and B, the SFT arms, and every arm evaluated in A, B and C (see the module docstring)."""
    cross = from_config(ClawCrossConfig, config.cross.to_dict(), "cross")
    if tuple(config.teacher.harnesses) != HARNESS_PAIR:
        raise ValueError(f"teacher.harnesses must be {HARNESS_PAIR}: the arms are drawn from both")
    third_party = claw_smolagents_harness(cross.third_party_max_turns, cross.third_party_wall_clock_s)
    matrix, ready = await run_arms(CLAW, config, workdir, rerun, cross, {name: make_harness(name) for name in HARNESS_PAIR},
                                   third_party, ("sampled",), ("sampled",))
    summary = {**matrix_summary(matrix, HARNESS_PAIR), "tasks": ready.split.counts(), "teacher": ready.teaching.summary}
    summary["in_to_cross_harness_drop"].pop("safety_violations", None)  # a count, not a rate that drops
    write_json(os.path.join(workdir, "summary.json"), summary)
    return summary


def run(config: ConfigDict, workdir: str, *, rerun: bool = False) -> dict[str, Any]:
    """:func:`run_claw_cross_harness` from synchronous code."""
    return asyncio.run(run_claw_cross_harness(config, workdir, rerun=rerun))
