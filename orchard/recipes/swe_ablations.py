"""The paper's SWE ablations at toy scale, on the main job's real tasks (section 5.2 of the paper notes).

Three studies share the main job's first stages (:mod:`orchard.recipes.swe`: tasks, teacher
trajectories, tokenizer) in one workdir, and each trains and evaluates arms of its own:

* :func:`run_credit_assignment`: what unresolved trajectories teach. Arms (``credit.arms``):
  ``drop`` (resolved-only SFT), ``rise`` (plus their rise segments: the method), ``whole`` (plus
  them whole, unmasked: the failure the method avoids), each at **matched resolved trajectories**
  (every resolved one), and ``rise_matched_tokens`` / ``whole_matched_tokens`` at **matched trained
  tokens** (filled, in a seeded order, to ``drop``'s trained-token count, so they trade resolved
  runs for unresolved ones). The values behind the rise segments are the task family's estimator's
  (:func:`orchard.tasks.swe.oracle.estimator_for`); the LLM judge estimator is also run against
  ``orchard serve`` on a few teacher trajectories, to show that path works and how it agrees.
* :func:`run_scale_vs_selection`: SFT on ``fractions`` of the teacher data under each of
  ``selectors`` (:mod:`orchard.data.selection`; ``diverse`` is across the helpers the bugs are in).
* :func:`run_async_study`: asynchronous RL (``rl.max_staleness`` 1 and 2) against the synchronous loop, from
  the main job's SFT policy at an equal number of updates: wall time per update, rollouts a minute, the
  training curves and the final held-out rates, each bound's runs paired with the synchronous ones.
* :func:`run_rl_study`: from one SFT policy, BAR, fixed-N GRPO and dynamic filtering **at an equal
  budget of rollouts generated** (``rl.rollout_budget``), with greedy held-out success logged
  against rollouts spent; and BAR from a lighter and a heavier SFT initialisation (``init_steps``)
  at the same budget, with the change RL makes from each.

Every arm is run under each of the study's ``seeds`` (the SFT's initialisation and data order, the
selection's draw, or RL's sampling; the tasks, teacher data and evaluation episodes' seeds stay the
run's), evaluated on the held-out instances greedily and sampled (``eval.samples`` a task), and
summarised as mean, min and max over seeds; arms are compared with the paired per-task sign test
(:func:`~orchard.eval.metrics.paired_change`) on each task's rate averaged over seeds.

The workdir::

    tasks/, teacher/, tokenizer/        the main job's stages, shared by every study
    sft/<arm>/sft_data, sft, eval/      an SFT arm's examples (stats.json), policy and held-out episodes, named
                                        by what makes it (arm_directory: rise_all_1_s0_700 is the method on all
                                        the data, seed 0, 700 steps), so studies share the arms they have in common
    sft/<arm>/rl_<sampler>_s<seed>/     an RL run from that arm (metrics.jsonl: rollouts_total, held-out success)
    sft/<arm>/eval/rl_<sampler>_s<seed>_<pass>/  its final policy's evaluation
    sft/<arm>/rl_async<bound>_s<seed>/  an asynchronous RL run (the async study), evaluated the same way
    judge/                              the LLM judge's cached answers
    credit.json, scale.json, rl.json, async.json   each study's summary

Departures, at this scale: the teacher is the oracle teacher, the policy a tiny model trained from
scratch (so SFT teaches the whole skill, not only its credit assignment), and evaluation is on the
held-out instances only: no policy of the main job resolves a held-out-helper bug.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import statistics
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, replace
from typing import Any

import jax
from ml_collections import ConfigDict

from orchard.config import from_config
from orchard.data.rise import annotate, rise_segments
from orchard.data.trajectory import Trajectory, read_trajectories
from orchard.eval.judge import LLMJudge
from orchard.eval.metrics import paired_change, seed_spread
from orchard.eval.runner import Evaluation
from orchard.harness.bash import BashHarness
from orchard.models.shipped import resolve
from orchard.models.transformer import Transformer
from orchard.recipes.family import Context, Split
from orchard.recipes.runner import Prepared, eval_directory, evaluation_stage, open_run, prepare
from orchard.recipes.stages import episodes_path, text_sft_stage, trained_policy
from orchard.recipes.swe import SWE, SWEConfig
from orchard.rollout.local_serving import serve_app
from orchard.rollout.server import ModelServer, create_app
from orchard.seeds import derive_seed
from orchard.tasks.swe.oracle import estimator_for
from orchard.tasks.swe.taskset import helper_key
from orchard.train.metrics import read_metrics
from orchard.train.rl import train_rl
from orchard.workdir import made_by, read_json, write_json

log = logging.getLogger(__name__)
MATCHED_TOKENS = "_matched_tokens"  # an arm name's suffix: filled to resolved-only SFT's trained tokens


@dataclass(frozen=True)
class CreditConfig:
    arms: tuple[str, ...] = ("drop", "rise", "whole", "rise" + MATCHED_TOKENS, "whole" + MATCHED_TOKENS)
    seeds: tuple[int, ...] = (0, 1, 2)
    passes: tuple[str, ...] = ("greedy", "sampled")
    judge_trajectories: int = 3  # unresolved teacher trajectories the LLM judge values (0: none)
    judge_model: str = "smollm2"  # what orchard serve serves as the judge (a shipped name or a directory)
    judge_max_tokens: int = 256
    # The served judge's compute dtype. On the CPU, float32 compiles and runs faster than the checkpoint's
    # bfloat16: SmolLM2 answering a 1,200-token prompt with 48 tokens took 35 core-seconds against 55.
    judge_dtype: str = "float32"


@dataclass(frozen=True)
class ScaleConfig:
    fractions: tuple[float, ...] = (0.25, 0.5, 1.0)
    selectors: tuple[str, ...] = ("random", "one_per_task", "diverse")
    seeds: tuple[int, ...] = (0,)
    passes: tuple[str, ...] = ("greedy",)


@dataclass(frozen=True)
class RLStudyConfig:
    samplers: tuple[str, ...] = ("bar", "fixed", "dynamic")
    seeds: tuple[int, ...] = (0, 1)
    # SFT steps of the initialisations: the samplers start from the last (the heavier); BAR also from each other
    init_steps: tuple[int, ...] = (250, 700)
    max_steps: int = 100  # RL's step cap; the rollout budget (rl.rollout_budget) ends each run first
    eval_every: int = 2  # greedy held-out success every this many RL steps, for the curve against rollouts


@dataclass(frozen=True)
class AsyncStudyConfig:
    bounds: tuple[int, ...] = (0, 1, 2)  # rl.max_staleness of each arm (0: the synchronous loop)
    seeds: tuple[int, ...] = (0, 1, 2)
    num_steps: int = 14  # RL steps of every run (the main job's): equal updates, whatever rollouts they spend
    passes: tuple[str, ...] = ("greedy", "sampled")  # each run's final held-out evaluations


@dataclass
class Shared:
    """What every study starts from: the main job's split, teacher data and tokenizer, and the sandboxes."""

    ctx: Context
    ready: Prepared

    @property
    def settings(self) -> SWEConfig:
        return self.ctx.settings

    @property
    def split(self) -> Split:
        return self.ready.split

    @property
    def trajectories(self) -> list[Trajectory]:
        return self.ready.teaching.trajectories

    @property
    def made_by(self) -> dict[str, str]:
        return {"tasks": self.split.made_by, "teacher": self.ready.teaching.made_by,
                "tokenizer": self.ready.tokenizer_made.made_by}

    def group(self, trajectory: Trajectory) -> str:
        """A teacher trajectory's group for the ``diverse`` selector: the helper its bug is in."""
        return next(helper_key(t.instance) for t in self.split.sft if t.id == trajectory.task_id)

    async def evaluate(self, root: str, stage: str, pass_: str, model: Transformer, policy_made_by: str
                       ) -> dict[str, Any]:
        """The main job's evaluation of ``model`` on the held-out instances in the bash harness, under ``root``."""
        return await evaluation_stage(SWE, self.ctx, root, self.split, "held_out", "bash", BashHarness(), stage, pass_,
                                      model, self.ready.tokenizer, {"policy": policy_made_by, "tasks": self.split.made_by})


def eval_dir(root: str, stage: str, pass_: str) -> str:
    """Where :meth:`Shared.evaluate` keeps an evaluation."""
    return eval_directory(root, "held_out", "bash", stage, pass_)


@contextlib.asynccontextmanager
async def shared_stages(config: ConfigDict, workdir: str, rerun: bool) -> AsyncIterator[Shared]:
    """The main job's tasks, teacher and tokenizer stages over ``workdir``, and a sandbox client, while the
    block runs."""
    async with open_run(SWE, config, workdir, rerun) as ctx:
        yield Shared(ctx, await prepare(SWE, ctx))


def arm_directory(workdir: str, seed: int, steps: int, unresolved: str = "rise", select: str = "all",
                  fraction: float = 1.0, token_budget: float = 0.0) -> str:
    """Where an SFT arm lives: named by everything that makes it, so an arm two studies share (the method's
    arm on all the data at the main job's steps is the credit study's ``rise``, the scale study's ``all``
    and the RL study's heavier initialisation) is trained and evaluated once."""
    matched = MATCHED_TOKENS if token_budget else ""
    return os.path.join(workdir, "sft", f"{unresolved}{matched}_{select}_{fraction:g}_s{seed}_{steps}")


async def sft_arm(shared: Shared, workdir: str, seed: int, passes: Sequence[str], *, num_steps: int | None = None,
                  **examples: Any) -> dict[str, Any]:
    """SFT on the teacher data with ``examples`` (``unresolved``, ``select``, ``fraction``, ``token_budget``
    of :class:`~orchard.recipes.sft_data.ExamplesConfig`) for ``num_steps`` (default: the config's) under
    ``seed`` (the SFT's, and the selection's through :func:`derive_seed`), then the held-out evaluation of
    each pass, in :func:`arm_directory`. Returns the evaluation results, the training data's stats, the
    final eval loss, and where it all is (``dir``; the policy in ``<dir>/sft/model``)."""
    base = shared.settings
    steps = num_steps or base.sft.num_steps
    arm_dir = arm_directory(workdir, seed, steps, **examples)
    settings = replace(base, sft=replace(base.sft, seed=seed, num_steps=steps),
                       examples=replace(base.examples, selection_seed=derive_seed(seed, "selection"), **examples))
    policy = text_sft_stage(settings, arm_dir, settings.examples, shared.trajectories, shared.ready.tokenizer,
                            shared.ready.tokenizer_made.directory, {"teacher": shared.made_by["teacher"],
                                                                    "tokenizer": shared.made_by["tokenizer"]},
                            shared.ctx.rerun, group=shared.group)
    model_dir, policy_made_by = policy.directory, policy.made_by
    model = trained_policy(settings, model_dir)
    results = {pass_: await shared.evaluate(arm_dir, "sft", pass_, model, policy_made_by) for pass_ in passes}
    metrics = read_metrics(os.path.join(arm_dir, "sft"))
    eval_losses = [m["eval_loss"] for _, m in sorted(metrics.items()) if "eval_loss" in m]
    return {"eval": results, "data": read_json(os.path.join(arm_dir, "sft_data", "stats.json"))["train"],
            "eval_loss": eval_losses[-1] if eval_losses else None, "model": model_dir, "made_by": policy_made_by,
            "dir": arm_dir}


def task_rates(eval_dirs: Sequence[str]) -> dict[str, float]:
    """Each held-out task's rate, averaged over the evaluations in ``eval_dirs`` (one per seed)."""
    rates = [Evaluation.of(list(read_trajectories(episodes_path(d)))).task_rates() for d in eval_dirs]
    return {task: sum(r[task] for r in rates) / len(rates) for task in rates[0]}


def arm_summary(per_seed: dict[int, dict[str, Any]], passes: Sequence[str]) -> dict[str, Any]:
    """Per seed and over seeds (:func:`seed_spread`): each pass's resolve rate (and the sampled pass's
    pass@k), the training data's trained tokens and trajectories, and the final eval loss."""
    measures: dict[str, list[float]] = {}
    for result in per_seed.values():
        for pass_ in passes:
            measures.setdefault(pass_, []).append(result["eval"][pass_]["resolve_rate"])
            if pass_ == "sampled":
                measures.setdefault("pass_at_k", []).append(result["eval"][pass_]["pass_at_k"])
        for name in ("trained_tokens", "trajectories", "resolved"):
            measures.setdefault(name, []).append(result["data"][name])
        if result["eval_loss"] is not None:
            measures.setdefault("eval_loss", []).append(result["eval_loss"])
    return {"seeds": {str(seed): {p: r["eval"][p]["resolve_rate"] for p in passes} | {"data": r["data"],
                                                                                         "eval_loss": r["eval_loss"]}
                      for seed, r in per_seed.items()},
            "spread": {name: seed_spread(values) for name, values in measures.items()}}


def paired(baseline: Sequence[str], arm: Sequence[str]) -> dict[str, float]:
    """:func:`paired_change` from the baseline's per-task rates to the arm's, each averaged over its seeds'
    evaluation folders."""
    return paired_change(task_rates(baseline), task_rates(arm)).to_dict()


def sft_eval_dirs(per_seed: dict[int, dict[str, Any]], pass_: str) -> list[str]:
    """The evaluation folders of one pass of an SFT arm's seeds."""
    return [eval_dir(r["dir"], "sft", pass_) for r in per_seed.values()]


def unresolved_arm(arm: str) -> tuple[str, bool]:
    """An arm name -> (what unresolved trajectories teach, whether its trained tokens match ``drop``'s)."""
    unresolved = arm.removesuffix(MATCHED_TOKENS)
    if unresolved not in ("drop", "rise", "whole") or (unresolved == "drop" and arm != "drop"):
        raise ValueError(f"unknown credit-assignment arm {arm!r}: drop, rise, whole, or rise/whole{MATCHED_TOKENS}")
    return unresolved, arm != unresolved


async def judge_values(shared: Shared, credit: CreditConfig, directory: str) -> dict[str, Any]:
    """The LLM judge estimator on ``credit.judge_trajectories`` unresolved teacher trajectories, its judge
    model served by ``orchard serve`` from this process: per trajectory, the judge's values and rise
    segments beside the task family's estimator's, or why the judge's replies were unusable."""
    chosen = [t for t in shared.trajectories if not t.outcome.resolved][: credit.judge_trajectories]
    if not chosen:
        return {}
    instances = {t.id: t.instance for t in shared.split.sft}
    server = ModelServer(resolve(credit.judge_model), name="judge", dtype=credit.judge_dtype)
    results = []
    try:
        with serve_app(create_app(server)) as url:
            judge = LLMJudge(url, "judge", cache_dir=os.path.join(directory, "cache"), retries=1,
                             max_tokens=credit.judge_max_tokens)
            for trajectory in chosen:
                rule = annotate(trajectory, estimator_for(instances[trajectory.task_id]))
                entry: dict[str, Any] = {"task_id": trajectory.task_id, "actions": trajectory.num_actions,
                                         "estimator_values": rule.values,
                                         "estimator_segments": rule.rise_segments}
                try:
                    values = await asyncio.to_thread(judge.estimate, trajectory)
                except ValueError as exc:  # the judge's replies never parsed: the path ran, the values are unusable
                    entry["judge_error"] = str(exc)
                else:
                    segments = rise_segments(values)
                    taught = {t for a, b in segments for t in range(a, b + 1)}
                    expected = {t for a, b in rule.rise_segments for t in range(a, b + 1)}
                    entry.update(judge_values=values, judge_segments=segments,
                                 action_agreement=sum((t in taught) == (t in expected)
                                                      for t in range(trajectory.num_actions))
                                 / max(trajectory.num_actions, 1))
                results.append(entry)
    finally:
        server.engine.close()
    usable = [r for r in results if "judge_values" in r]
    return {"model": credit.judge_model, "trajectories": results, "usable": len(usable),
            "mean_action_agreement": (sum(r["action_agreement"] for r in usable) / len(usable)) if usable else None}


async def run_credit_assignment(config: ConfigDict, workdir: str, *, rerun: bool = False) -> dict[str, Any]:
    """The credit-assignment study (see the module docstring); writes and returns ``credit.json``."""
    credit = from_config(CreditConfig, config.credit.to_dict(), "credit")
    arms = [unresolved_arm(arm) for arm in credit.arms]
    if any(matched for _, matched in arms) and "drop" not in credit.arms:
        raise ValueError("the matched-token arms are filled to the drop arm's trained tokens: list drop among the arms")
    order = sorted(credit.arms, key=lambda arm: arm != "drop")  # drop first: its tokens are the others' budget
    summary: dict[str, Any] = {"arms": {}, "paired_vs_drop": {}, "seeds": list(credit.seeds)}
    async with shared_stages(config, workdir, rerun) as shared:
        per_arm: dict[str, dict[int, dict[str, Any]]] = {}
        for arm in order:
            unresolved, matched = unresolved_arm(arm)
            per_arm[arm] = {}
            for seed in credit.seeds:
                budget = per_arm["drop"][seed]["data"]["trained_tokens"] if matched else 0.0
                log.info("credit arm %s, seed %d%s", arm, seed, f": {budget:.0f} trained tokens" if matched else "")
                per_arm[arm][seed] = await sft_arm(shared, workdir, seed, credit.passes, unresolved=unresolved,
                                                   token_budget=budget)
            summary["arms"][arm] = arm_summary(per_arm[arm], credit.passes)
        for arm in credit.arms:
            if arm != "drop" and "drop" in per_arm:
                summary["paired_vs_drop"][arm] = {
                    pass_: paired(sft_eval_dirs(per_arm["drop"], pass_), sft_eval_dirs(per_arm[arm], pass_))
                    for pass_ in credit.passes}
        if credit.judge_trajectories:
            summary["judge"] = await judge_values(shared, credit, os.path.join(workdir, "judge"))
    write_json(os.path.join(workdir, "credit.json"), summary)
    return summary


async def run_scale_vs_selection(config: ConfigDict, workdir: str, *, rerun: bool = False) -> dict[str, Any]:
    """The data-scale against selection study (see the module docstring); writes and returns ``scale.json``:
    ``grid[selector][fraction]`` an arm's summary (every selector's ``1`` is the same arm: all the data)."""
    scale = from_config(ScaleConfig, config.scale.to_dict(), "scale")
    grid: dict[str, dict[str, Any]] = {}
    async with shared_stages(config, workdir, rerun) as shared:
        cells: dict[tuple[str, float], dict[str, Any]] = {}
        for fraction in scale.fractions:
            for selector in scale.selectors:
                rule = selector if fraction < 1.0 else "all"
                if (rule, fraction) not in cells:
                    per_seed = {}
                    for seed in scale.seeds:
                        log.info("scale arm %s of %g of the data, seed %d", rule, fraction, seed)
                        per_seed[seed] = await sft_arm(shared, workdir, seed, scale.passes, select=rule,
                                                       fraction=fraction)
                    cells[rule, fraction] = arm_summary(per_seed, scale.passes)
                grid.setdefault(selector, {})[f"{fraction:g}"] = cells[rule, fraction]
    summary = {"grid": grid, "fractions": list(scale.fractions), "selectors": list(scale.selectors),
               "passes": list(scale.passes),
               "seeds": list(scale.seeds), "teacher_trajectories": len(shared.trajectories)}
    write_json(os.path.join(workdir, "scale.json"), summary)
    return summary


def rl_run_summary(rl_dir: str, start: dict[str, float], result: dict[str, dict[str, float]]) -> dict[str, Any]:
    """One RL run's rollout economy, from its metrics, and its final evaluation: rollouts generated, the
    informative share of the chosen groups, informative groups bought per 100 rollouts, rollouts per update,
    the positive share of the chosen rollouts, and the greedy held-out curve against rollouts spent (from
    the SFT policy's rate at 0 to the final policy's)."""
    metrics = [m for _, m in sorted(read_metrics(rl_dir).items())]
    chosen = sum(m["groups_chosen"] for m in metrics)
    informative = sum(m["informative_chosen"] * m["groups_chosen"] for m in metrics)
    spent = metrics[-1]["rollouts_total"] if metrics else 0.0
    updates = sum(m["groups_chosen"] > 0 for m in metrics)
    curve = [(0.0, start["resolve_rate"])]
    curve += [(m["rollouts_total"], m["held_out_success/held_out"]) for m in metrics if "held_out_success/held_out" in m]
    curve.append((spent, result["greedy"]["resolve_rate"]))
    return {"steps": len(metrics), "rollouts": spent, "updates": updates,
            "informative_chosen": informative / max(chosen, 1),
            "informative_per_100_rollouts": 100 * informative / max(spent, 1),
            "rollouts_per_update": spent / max(updates, 1),
            "rollouts_per_group": spent / max(chosen, 1),
            "positive_fraction": (sum(m["positive_fraction"] * m["groups_chosen"] for m in metrics) / max(chosen, 1)),
            "greedy_curve": curve, "eval": result}


async def run_rl_study(config: ConfigDict, workdir: str, *, rerun: bool = False) -> dict[str, Any]:
    """The RL study (see the module docstring); writes and returns ``rl.json``."""
    study = from_config(RLStudyConfig, config.rl_study.to_dict(), "rl_study")
    passes = ("greedy", "sampled")
    heavy = study.init_steps[-1]
    async with shared_stages(config, workdir, rerun) as shared:
        base = shared.settings
        if not base.rl.rollout_budget:
            raise ValueError("the RL study compares samplers at an equal rollout budget: set rl.rollout_budget")
        summary: dict[str, Any] = {"budget": base.rl.rollout_budget, "seeds": list(study.seeds), "inits": {},
                                   "samplers": {}, "init_change": {}}
        held_out = {"held_out": shared.split.held_out["held_out"]}
        runs: list[tuple[int, str]] = [(heavy, s) for s in study.samplers]
        runs += [(steps, "bar") for steps in study.init_steps[:-1]]
        for steps in study.init_steps:
            init = await sft_arm(shared, workdir, base.seed, passes, num_steps=steps)
            init_dir = init["dir"]
            summary["inits"][str(steps)] = {"eval": init["eval"], "eval_loss": init["eval_loss"]}
            for sampler in [s for n, s in runs if n == steps]:
                per_seed = {}
                for seed in study.seeds:
                    name = f"{sampler}_s{seed}"
                    rl = replace(base.rl, seed=seed, num_steps=study.max_steps, eval_every=study.eval_every,
                                 sampler=replace(base.rl.sampler, name=sampler))
                    rl_dir = os.path.join(init_dir, f"rl_{name}")
                    log.info("RL %s from %d SFT steps, seed %d, to %d rollouts", sampler, steps, seed, rl.rollout_budget)
                    await train_rl(rl, rl_dir, shared.ctx.client, shared.split.rl, BashHarness(),
                                   policy=init["model"], tokenizer=shared.ready.tokenizer_made.directory,
                                   inputs={"policy": init["made_by"], "tasks": shared.made_by["tasks"]}, rerun=rerun,
                                   setups=shared.ctx.setups, held_out=held_out)
                    model = trained_policy(base, os.path.join(rl_dir, "model"))
                    result = {pass_: await shared.evaluate(init_dir, f"rl_{name}", pass_, model, made_by(rl_dir))
                              for pass_ in passes}
                    per_seed[seed] = rl_run_summary(rl_dir, init["eval"]["greedy"], result)
                entry = {"seeds": {str(s): r for s, r in per_seed.items()},
                         "spread": {m: seed_spread([r[m] for r in per_seed.values()])
                                    for m in ("rollouts", "informative_chosen", "informative_per_100_rollouts",
                                              "rollouts_per_update", "positive_fraction", "steps", "updates")}
                         | {p: seed_spread([r["eval"][p]["resolve_rate"] for r in per_seed.values()]) for p in passes},
                         "change_from_sft": {p: paired([eval_dir(init_dir, "sft", p)],
                                                       [eval_dir(init_dir, f"rl_{sampler}_s{s}", p)
                                                        for s in study.seeds]) for p in passes}}
                if steps == heavy:
                    summary["samplers"][sampler] = entry
                if sampler == "bar":
                    summary["init_change"][str(steps)] = {
                        "sft": {p: init["eval"][p]["resolve_rate"] for p in passes},
                        "rl": {p: entry["spread"][p] for p in passes}, "paired": entry["change_from_sft"]}
    write_json(os.path.join(workdir, "rl.json"), summary)
    return summary


def async_run_summary(rl_dir: str, result: dict[str, dict[str, float]]) -> dict[str, Any]:
    """One RL run's speed and learning, from its metrics: wall seconds per update (the learner's wait for
    rollouts plus its update, the loop's whole step), rollouts a minute, the staleness of what it trained
    on, and the training reward and resolve rate against rollouts spent; and its final evaluation."""
    metrics = [m for _, m in sorted(read_metrics(rl_dir).items())]
    walls = [m["wait_s"] + m["learn_s"] for m in metrics]
    spent = metrics[-1]["rollouts_total"] if metrics else 0.0
    return {"steps": len(metrics), "rollouts": spent, "wall_s": sum(walls),
            "wall_per_update_s": statistics.fmean(walls) if walls else 0.0,
            "rollouts_per_minute": 60 * spent / max(sum(walls), 1e-9),
            "learn_s": statistics.fmean(m["learn_s"] for m in metrics) if metrics else 0.0,
            "wait_s": statistics.fmean(m["wait_s"] for m in metrics) if metrics else 0.0,
            "staleness_mean": statistics.fmean(m["staleness_mean"] for m in metrics) if metrics else 0.0,
            "partial_rollouts": sum(m["partial_rollouts"] for m in metrics),
            "stale_dropped": sum(m["stale_dropped"] for m in metrics),
            "reward_curve": [(m["rollouts_total"], m["reward"]) for m in metrics],
            "resolve_curve": [(m["rollouts_total"], m["resolve_rate"]) for m in metrics],
            "eval": result}


ASYNC_MEASURES = ("wall_per_update_s", "rollouts_per_minute", "learn_s", "wait_s", "staleness_mean",
                  "partial_rollouts", "stale_dropped", "rollouts")


async def run_async_study(config: ConfigDict, workdir: str, *, rerun: bool = False) -> dict[str, Any]:
    """Asynchronous RL against the synchronous loop (:mod:`orchard.train.pipeline`): from the main job's SFT
    policy, BAR at each ``rl.max_staleness`` of ``async_study.bounds`` for the same number of updates under
    each seed; each run's wall time per update, rollouts a minute and training curves, its final held-out
    rates, and each bound's paired per-task change against the synchronous runs. Writes and returns
    ``async.json``."""
    study = from_config(AsyncStudyConfig, config.async_study.to_dict(), "async_study")
    passes = study.passes
    async with shared_stages(config, workdir, rerun) as shared:
        base = shared.settings
        init = await sft_arm(shared, workdir, base.seed, passes)
        init_dir = init["dir"]
        summary: dict[str, Any] = {"num_steps": study.num_steps, "seeds": list(study.seeds), "passes": list(passes),
                                   "cpus": os.cpu_count(), "devices": [str(d) for d in jax.devices()],
                                   "sft": {p: init["eval"][p]["resolve_rate"] for p in passes}, "bounds": {}}
        for bound in study.bounds:
            per_seed = {}
            for seed in study.seeds:
                name = f"async{bound}_s{seed}"
                rl = replace(base.rl, seed=seed, num_steps=study.num_steps, rollout_budget=0, eval_every=0,
                             max_staleness=bound)
                rl_dir = os.path.join(init_dir, f"rl_{name}")
                log.info("RL at max_staleness %d, seed %d, %d steps", bound, seed, rl.num_steps)
                await train_rl(rl, rl_dir, shared.ctx.client, shared.split.rl, BashHarness(), policy=init["model"],
                               tokenizer=shared.ready.tokenizer_made.directory,
                               inputs={"policy": init["made_by"], "tasks": shared.made_by["tasks"]}, rerun=rerun,
                               setups=shared.ctx.setups)
                model = trained_policy(base, os.path.join(rl_dir, "model"))
                result = {pass_: await shared.evaluate(init_dir, f"rl_{name}", pass_, model, made_by(rl_dir))
                          for pass_ in passes}
                per_seed[seed] = async_run_summary(rl_dir, result)
            dirs = {p: [eval_dir(init_dir, f"rl_async{bound}_s{s}", p) for s in study.seeds] for p in passes}
            summary["bounds"][str(bound)] = {
                "seeds": {str(s): r for s, r in per_seed.items()},
                "spread": {m: seed_spread([r[m] for r in per_seed.values()]) for m in ASYNC_MEASURES}
                | {p: seed_spread([r["eval"][p]["resolve_rate"] for r in per_seed.values()]) for p in passes},
                "change_from_sft": {p: paired([eval_dir(init_dir, "sft", p)], dirs[p]) for p in passes},
                "dirs": dirs}
        synchronous = summary["bounds"].get("0")
        for entry in summary["bounds"].values():
            if synchronous is not None:
                entry["speedup"] = (synchronous["spread"]["wall_per_update_s"]["mean"]
                                    / max(entry["spread"]["wall_per_update_s"]["mean"], 1e-9))
                entry["change_from_synchronous"] = {p: paired(synchronous["dirs"][p], entry["dirs"][p])
                                                    for p in passes}
    write_json(os.path.join(workdir, "async.json"), summary)
    return summary


STUDIES = {"credit": run_credit_assignment, "scale": run_scale_vs_selection, "rl": run_rl_study,
           "async": run_async_study}


def run(config: ConfigDict, workdir: str, *, rerun: bool = False) -> dict[str, Any]:
    """Every study ``config.studies`` names (``credit``, ``scale``, ``rl``, ``async``), from synchronous code."""
    unknown = set(config.studies) - set(STUDIES)
    if unknown:
        raise ValueError(f"unknown studies {sorted(unknown)}: of {sorted(STUDIES)}")
    return {name: asyncio.run(STUDIES[name](config, workdir, rerun=rerun)) for name in config.studies}
