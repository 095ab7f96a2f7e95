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
from orchard.env import orchestrator
from orchard.harness.claw import claw_smolagents_harness
from orchard.harness.episode import SandboxPool
from orchard.recipes.claw import claw_config, evaluation_stage, tasks_stage, teaching
from orchard.recipes.cross_harness import arm_trajectories, matrix_summary, third_party_runner
from orchard.recipes.swe import sft_stage, trained_policy
from orchard.workdir import write_json

log = logging.getLogger(__name__)
HARNESS_PAIR = ("claw", "claw-shell")  # A and B: the harnesses the teacher runs and the arms train in
MEASURES = ("pass_hat_k", "pass_at_k", "mean_score", "safety_violations")


@dataclass(frozen=True)
class ClawCrossConfig:
    arms: tuple[str, ...] = ("claw", "claw-shell", "both")
    third_party_steps: int = 8  # smolagents' max_steps
    third_party_concurrency: int = 4
    third_party_wall_clock_s: float = 300.0


async def run_claw_cross_harness(config: ConfigDict, workdir: str, *, rerun: bool = False) -> dict[str, Any]:
    """The teacher in A and B, the SFT arms, and every arm evaluated in A, B and C (see the module docstring)."""
    settings = claw_config(config)
    cross = from_config(ClawCrossConfig, config.cross.to_dict(), "cross")
    if unknown := [arm for arm in cross.arms if arm not in (*HARNESS_PAIR, "both")]:
        raise ValueError(f"cross.arms {unknown}: each is one of {', '.join((*HARNESS_PAIR, 'both'))}")
    if settings.teacher.harnesses != HARNESS_PAIR:
        raise ValueError(f"teacher.harnesses must be {HARNESS_PAIR}: the arms are drawn from both")
    os.makedirs(workdir, exist_ok=True)
    write_json(os.path.join(workdir, "config.json"), config)
    split, tasks_made_by = await asyncio.to_thread(tasks_stage, settings, workdir, rerun)
    third_party = claw_smolagents_harness(cross.third_party_steps, cross.third_party_wall_clock_s)
    matrix: dict[str, dict[str, dict[str, float]]] = {}
    with orchestrator(settings.env.url, settings.env.api_key) as endpoint:
        client = endpoint.async_client()
        pool = SandboxPool(settings.harness.pool) if settings.harness.pool else None
        try:
            taught = await teaching(settings, workdir, client, pool, split, tasks_made_by, rerun)
            for arm in cross.arms:
                arm_dir = os.path.join(workdir, "arms", arm)
                share = arm_trajectories(taught.trajectories, arm, settings.seed, HARNESS_PAIR)
                log.info("arm %s: SFT on %d teacher episodes", arm, len(share))
                model_dir, made_by = sft_stage(settings, arm_dir, share, taught.tokenizer, taught.tokenizer_dir,
                                               {"teacher": taught.made_by, "tokenizer": taught.tokenizer_made_by,
                                                "arm": arm}, rerun)
                model = trained_policy(settings, model_dir)
                inputs = {"policy": made_by, "tasks": tasks_made_by}
                results = {harness: await evaluation_stage(settings, arm_dir, client, pool, "sft", harness, model,
                                                           taught.tokenizer, split.held_out, inputs, rerun)
                           for harness in settings.harness.eval}

                def external(temperature: float, model_dir: str = model_dir, arm_dir: str = arm_dir):
                    return third_party_runner(settings, cross, model_dir, os.path.join(arm_dir, "proxy_records"),
                                              client, None, third_party, temperature)

                results[third_party.name] = await evaluation_stage(settings, arm_dir, client, pool, "sft",
                                                                   third_party.name, None, None, split.held_out,
                                                                   inputs, rerun, external=external)
                matrix[arm] = {harness: {key: float(result[key]) for key in MEASURES}
                               for harness, result in results.items()}
        finally:
            if pool is not None:
                await pool.close()
            await client.aclose()
    summary = {**matrix_summary(matrix, HARNESS_PAIR), "tasks": split.counts(), "teacher": taught.summary}
    summary["in_to_cross_harness_drop"].pop("safety_violations", None)  # a count, not a rate that drops
    write_json(os.path.join(workdir, "summary.json"), summary)
    return summary


def run(config: ConfigDict, workdir: str, *, rerun: bool = False) -> dict[str, Any]:
    """:func:`run_claw_cross_harness` from synchronous code."""
    return asyncio.run(run_claw_cross_harness(config, workdir, rerun=rerun))
