"""Cross-harness training at toy scale: does a policy trained in one harness still work in another?

The paper (section 5.2) finds harness lock-in: a model trained and evaluated with mini-swe-agent
resolves 57.9, and 19.0 when only the evaluation harness changes; training on both narrows it.
This recipe reproduces the design on the main job's SWE tasks, one tokenizer for every arm:

* **teacher**: the oracle teacher in harness A (the bash harness) and harness B (the CodeAct
  harness) on every SFT task;
* **arms**, credit-assignment SFT at an equal data budget (the same number of teacher trajectories,
  the same steps): ``bash`` (A only), ``codeact`` (B only), ``both`` (A's trajectories of a seeded
  half of the tasks, B's of the other half);
* **evaluation** of every arm on the held-out tasks in A and B (greedy and sampled, the in-process
  engine), and in C, a harness none was trained on: smolagents' ``CodeAgent``
  (:mod:`orchard.harness.adapters.smolagents_agent`), a process of its own calling the arm's policy
  through ``orchard serve`` and the recording proxy, both served from this process for the occasion.

The workdir::

    config.json, tasks/, teacher/, tokenizer/      as in the main job (orchard.recipes.runner)
    arms/<arm>/sft_data, sft/                       each arm's examples and policy
    arms/<arm>/eval/held_out/<harness>/sft_<pass>/  its held-out episodes and result.json
    summary.json                                    the matrix: arm -> harness -> pass -> resolve rate

The arms are a study on the recipe runner (:func:`run_arms`, which the Claw cross-harness recipe
shares): the runner's tasks, teacher and tokenizer stages, then per arm its SFT stage and its
evaluations. Departures, at this scale: C's prompts are long (smolagents' system prompt is about 5,600 tokens of
the main job's BPE), so the policy's context is raised for every arm (``model.init``'s
``max_position_embeddings``; RoPE has no learnt positions) though it trains on 1,024-token rows.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import Any

from ml_collections import ConfigDict

from orchard.config import from_config
from orchard.data.trajectory import Trajectory
from orchard.env import AsyncSandboxClient
from orchard.harness.adapters.external import ExternalHarness, ExternalRunner
from orchard.harness.adapters.smolagents_agent import smolagents_harness
from orchard.harness.bash import BashHarness
from orchard.harness.codeact import CodeActHarness
from orchard.harness.core import DEFAULT_MAX_TURNS, Harness
from orchard.harness.episode import SetupCache
from orchard.recipes.family import Family
from orchard.recipes.runner import Prepared, evaluation_stage, open_run, prepare
from orchard.recipes.stages import text_sft_stage, trained_policy
from orchard.recipes.swe import SWEFamily
from orchard.rollout.local_serving import serve_app
from orchard.rollout.proxy import ProxyConfig, RecordingProxy, create_proxy_app
from orchard.rollout.proxy_client import ProxyClient
from orchard.rollout.server import ModelServer, create_app
from orchard.seeds import seeded_random
from orchard.tasks.swe.workspace import REPO_DIR, submission_patch
from orchard.workdir import write_json

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class CrossHarnessConfig:
    arms: tuple[str, ...] = ("bash", "codeact", "both")
    passes: tuple[str, ...] = ("greedy", "sampled")  # in harnesses A and B
    third_party_passes: tuple[str, ...] = ("greedy",)  # in harness C
    third_party_max_turns: int = DEFAULT_MAX_TURNS  # smolagents' max_steps
    third_party_concurrency: int = 4
    third_party_wall_clock_s: float = 300.0


def arm_trajectories(trajectories: Sequence[Trajectory], arm: str, seed: int,
                     harnesses: tuple[str, str] = ("bash", "codeact")) -> list[Trajectory]:
    """An arm's share of the teacher trajectories: one harness's (``arm`` is its name), or for ``both``,
    the first harness's of a seeded half of the tasks and the second's of the other half, so every arm
    gets as many as one harness has."""
    if arm not in (*harnesses, "both"):
        raise ValueError(f"unknown arm {arm!r}: one of {sorted((*harnesses, 'both'))}")
    if arm != "both":
        return [t for t in trajectories if t.harness == arm]
    tasks = sorted({t.task_id for t in trajectories})
    seeded_random(seed, "arm-both-halves").shuffle(tasks)
    first = set(tasks[: len(tasks) // 2])
    return [t for t in trajectories if t.harness in harnesses and (t.harness == harnesses[0]) == (t.task_id in first)]


@contextlib.asynccontextmanager
async def third_party_runner(settings: Any, cross: Any, model_dir: str, records: str,
                             client: AsyncSandboxClient, setups: SetupCache | None, harness: ExternalHarness,
                             temperature: float) -> AsyncIterator[ExternalRunner]:
    """An :class:`ExternalRunner` of ``harness`` over the policy in ``model_dir``, which ``orchard
    serve`` and the recording proxy serve from this process while the block runs. ``settings`` is a
    recipe's typed config (its ``chat_format``, ``model.dtype``, ``rl.rollout.max_new_tokens`` and
    ``rl.engine.prefix_cache_mb`` are used), ``cross`` its cross-harness block (``third_party_concurrency`` and
    ``third_party_wall_clock_s``)."""
    server = ModelServer(model_dir, name="policy", chat_format=settings.chat_format, dtype=settings.model.dtype,
                         prefix_cache_mb=settings.rl.engine.prefix_cache_mb)
    try:
        with serve_app(create_app(server)) as model_url, \
                serve_app(create_proxy_app(RecordingProxy(ProxyConfig(model_url, records, model="policy")))) as url:
            proxy = ProxyClient(url)
            try:
                yield ExternalRunner(client, harness, proxy, sampling={
                    "temperature": temperature, "max_tokens": settings.rl.rollout.max_new_tokens},
                    concurrency=cross.third_party_concurrency, setups=setups,
                    episode_seconds=2 * cross.third_party_wall_clock_s)
            finally:
                await proxy.aclose()
    finally:
        server.engine.close()


def matrix_summary(matrix: dict[str, dict[str, dict[str, float]]],
                   harnesses: tuple[str, str] = ("bash", "codeact")) -> dict[str, Any]:
    """The matrix (arm -> harness -> measure -> value: a pass's resolve rate, or pass^k and pass@k) and,
    per measure, each single-harness arm's drop from its own harness to the other one, as the paper's
    table reports it."""
    drops: dict[str, dict[str, float]] = {}
    for own, other in (harnesses, harnesses[::-1]):
        for pass_ in matrix.get(own, {}).get(own, {}):
            if other in matrix.get(own, {}) and pass_ in matrix[own][other]:
                drops.setdefault(pass_, {})[own] = matrix[own][own][pass_] - matrix[own][other][pass_]
    return {"matrix": matrix, "in_to_cross_harness_drop": drops}


async def run_arms(family: Family, config: ConfigDict, workdir: str, rerun: bool, cross: Any,
                   pair: dict[str, Harness], third_party: ExternalHarness, passes: Sequence[str],
                   third_party_passes: Sequence[str]) -> tuple[dict[str, Any], Prepared]:
    """The shared stages, then every arm of ``cross.arms``: SFT on its share of the teacher's episodes
    (:func:`arm_trajectories` over the two harnesses of ``pair``), evaluated in both (``passes``) and in
    ``third_party`` (``third_party_passes``). Returns the matrix (arm -> harness -> pass or measure ->
    value: the resolve rate of each pass, or the family's measures of its one pass) and the shared stages."""
    names = tuple(pair)
    if unknown := [arm for arm in cross.arms if arm not in (*names, "both")]:
        raise ValueError(f"cross.arms {unknown}: each is one of {', '.join((*names, 'both'))}")
    matrix: dict[str, dict[str, dict[str, float]]] = {}
    async with open_run(family, config, workdir, rerun) as ctx:
        settings = ctx.settings
        ready = await prepare(family, ctx)
        for arm in cross.arms:
            arm_dir = os.path.join(workdir, "arms", arm)
            share = arm_trajectories(ready.teaching.trajectories, arm, settings.seed, names)
            log.info("arm %s: SFT on %d teacher trajectories", arm, len(share))
            policy = text_sft_stage(settings, arm_dir, settings.examples, share, ready.tokenizer,
                                    ready.tokenizer_made.directory, {"teacher": ready.teaching.made_by,
                                                                     "tokenizer": ready.tokenizer_made.made_by,
                                                                     "arm": arm}, rerun)
            model = trained_policy(settings, policy.directory)
            inputs = {"policy": policy.made_by, "tasks": ready.split.made_by}
            results = {name: {pass_: await evaluation_stage(family, ctx, arm_dir, ready.split, "held_out", name, harness,
                                                            "sft", pass_, model, ready.tokenizer, inputs)
                              for pass_ in passes} for name, harness in pair.items()}

            def external(temperature: float, model_dir: str = policy.directory, arm_dir: str = arm_dir):
                return third_party_runner(settings, cross, model_dir, os.path.join(arm_dir, "proxy_records"),
                                          ctx.client, ctx.setups, third_party, temperature)

            results[third_party.name] = {
                pass_: await evaluation_stage(family, ctx, arm_dir, ready.split, "held_out", third_party.name, None,
                                              "sft", pass_, None, None, inputs, external=external)
                for pass_ in third_party_passes}
            matrix[arm] = {harness: matrix_cell(family, by_pass) for harness, by_pass in results.items()}
    return matrix, ready


def matrix_cell(family: Family, by_pass: dict[str, dict[str, Any]]) -> dict[str, float]:
    """One cell of the matrix: the resolve rate of each pass, or (for a family with other measures) the
    family's measures of its one pass."""
    if family.measures == ("resolve_rate",):
        return {pass_: result["resolve_rate"] for pass_, result in by_pass.items()}
    [result] = by_pass.values()
    return {measure: float(result[measure]) for measure in family.measures}


async def run_cross_harness(config: ConfigDict, workdir: str, *, rerun: bool = False) -> dict[str, Any]:
    """The teacher in A and B, the three SFT arms, and every arm evaluated in A, B and C (see the module docstring)."""
    cross = from_config(CrossHarnessConfig, config.cross.to_dict(), "cross")
    pair: dict[str, Harness] = {"bash": BashHarness(), "codeact": CodeActHarness()}
    third_party = smolagents_harness(cross.third_party_max_turns, submission_patch, cross.third_party_wall_clock_s,
                                     cwd=REPO_DIR)
    matrix, _ = await run_arms(SWEFamily(teacher_harnesses=tuple(pair.values())), config, workdir, rerun, cross, pair,
                               third_party, cross.passes, cross.third_party_passes)
    summary = matrix_summary(matrix)
    write_json(os.path.join(workdir, "summary.json"), summary)
    return summary


def run(config: ConfigDict, workdir: str, *, rerun: bool = False) -> dict[str, Any]:
    """:func:`run_cross_harness` from synchronous code."""
    return asyncio.run(run_cross_harness(config, workdir, rerun=rerun))
