"""The recipe runner: one pipeline of stages over one workdir, for any task family.

:func:`run_recipe` runs a :class:`~orchard.recipes.family.Family`'s recipe::

    config.json            the whole resolved config of the run
    tasks/                 the family's tasks and their split (Family.tasks)
    teacher/               trajectories.jsonl: the teacher's kept episodes (Family.teach)
    tokenizer/             a BPE of the teacher text, unless the config names a tokenizer
    pretrain_data/, pretrain/   copying lessons for a policy trained from scratch (pretrain.num_steps > 0):
                           what the policy is at init, and where SFT starts
    sft_data/, sft/        examples (Family.sft), checkpoints, metrics, model/
    rl/                    checkpoints, metrics, model/ (orchard.train.rl over the family's RL harness)
    eval/<set>/<harness>/<stage>_<pass>/   result.json and the episodes behind it: every held-out set,
                           in every evaluation harness, at init, after SFT and after RL, greedy (one
                           episode a task at T = 0) and sampled (eval.samples a task at eval.temperature,
                           by default the rollouts'), as the family's passes say
    summary.json           one schema for every family (:class:`RecipeResult`)

Every stage is cached by the hash of its config and inputs (:class:`~orchard.workdir.Stage`): a rerun
reuses what is done, a killed SFT or RL stage resumes, and a changed config stops the run at the first
stage it changes unless ``rerun`` redoes it and the stages after it. Studies (cross-harness training,
ablations) are arms over the same stages: :func:`open_run` and :func:`prepare` give them the shared
stages, and :func:`evaluate` evaluates an arm's policy.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from ml_collections import ConfigDict

from orchard.config import fingerprint
from orchard.data.tokenizer import Tokenizer
from orchard.data.trajectory import save_trajectories
from orchard.env import orchestrator
from orchard.eval.runner import evaluate_policy
from orchard.harness.core import Harness
from orchard.harness.task import Task
from orchard.models.shipped import resolve
from orchard.models.transformer import Transformer
from orchard.models.weights import save_pretrained
from orchard.recipes.family import Context, Family, Split, Teaching
from orchard.recipes.stages import (
    STAGES,
    Clock,
    Made,
    SharedStages,
    episodes_path,
    pretrain_stage,
    sampled_change,
    starting_from,
    task_ids,
    tokenizer_stage,
    trained_policy,
)
from orchard.rollout.jax_engine import model_chat_format
from orchard.train.metrics import read_metrics
from orchard.train.rl import in_process_engine, make_policy, train_rl
from orchard.workdir import Stage, made_by, read_json, write_json

Metrics = dict[str, Any]
HeldOut = dict[str, dict[str, dict[str, dict[str, Metrics]]]]  # set -> harness -> stage -> pass -> metrics
External = Callable[[float], AbstractAsyncContextManager[Any]]  # temperature -> a runner of a harness Orchard does not run


@dataclass
class RecipeResult:
    """What every main job writes to ``summary.json``, whatever its family."""

    family: str
    config_digest: str
    tasks: dict[str, int]
    teacher: dict[str, Any]
    held_out: HeldOut
    changes: dict[str, dict[str, dict[str, dict[str, float]]]]  # set -> harness -> "<after>_vs_<before>" -> change
    rl_metrics: dict[int, dict[str, float]]
    seconds: dict[str, float]  # per stage, spent in this invocation (a reused stage takes ~0 s)
    extras: dict[str, Any] = field(default_factory=dict)  # what only the family reports

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["rl_metrics"] = {str(k): v for k, v in self.rl_metrics.items()}
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RecipeResult:
        return cls(**{**data, "rl_metrics": {int(k): v for k, v in data["rl_metrics"].items()}})

    @classmethod
    def load(cls, workdir: str) -> RecipeResult:
        return cls.from_dict(read_json(os.path.join(workdir, "summary.json")))

    def metric(self, held_out: str, harness: str, stage: str, pass_: str, name: str) -> float | None:
        """One number of one evaluation, or ``None`` where it was not run."""
        return self.held_out.get(held_out, {}).get(harness, {}).get(stage, {}).get(pass_, {}).get(name)


@dataclass
class Prepared:
    """The shared stages before training: the split, the teacher's episodes and the tokenizer."""

    split: Split
    teaching: Teaching
    tokenizer: Tokenizer
    tokenizer_made: Made


@contextlib.asynccontextmanager
async def open_run(family: Family, config: ConfigDict, workdir: str, rerun: bool) -> AsyncIterator[Context]:
    """The typed config (checked before anything runs), ``config.json``, a sandbox client (a local
    orchestrator unless the config names one) and the family's shared resources, while the block runs."""
    settings = family.typed(config)
    os.makedirs(workdir, exist_ok=True)
    write_json(os.path.join(workdir, "config.json"), config)
    with orchestrator(settings.env.url, settings.env.api_key) as endpoint:
        ctx = Context(settings, workdir, rerun, endpoint.async_client(), settings.mesh.make())
        family.open(ctx)
        try:
            yield ctx
        finally:
            await ctx.close()
            await ctx.client.aclose()


async def prepare(family: Family, ctx: Context, clock: Clock | None = None) -> Prepared:
    """Tasks, teacher and tokenizer: what every arm of a recipe shares."""
    clock = clock or Clock()
    split = await family.tasks(ctx)
    clock.lap("tasks")
    teaching = (await family.teach(ctx, split) if family.teaches(ctx.settings) else Teaching([], {}, ""))
    clock.lap("collect")
    tokenizer, made = tokenizer_stage(ctx.settings, ctx.workdir, teaching.trajectories, teaching.made_by, ctx.rerun,
                                      texts=family.tokenizer_texts, special_tokens=family.special_tokens)
    return Prepared(split, teaching, tokenizer, made)


def eval_directory(root: str, held_out: str, harness: str, stage: str, pass_: str) -> str:
    """The one eval folder layout: ``<root>/eval/<set>/<harness>/<stage>_<pass>``."""
    return os.path.join(root, "eval", held_out, harness, f"{stage}_{pass_}")


def sampled_temperature(settings: SharedStages) -> float:
    """The temperature of a sampled evaluation pass: ``eval.temperature``, or the rollouts' where it is 0."""
    return settings.eval.temperature or settings.rl.rollout.temperature


async def evaluation_stage(family: Family, ctx: Context, root: str, split: Split, held_out: str, harness_name: str,
                           harness: Harness | None, stage_name: str, pass_: str, model: Transformer | None,
                           tokenizer: Tokenizer | None, inputs: dict[str, str],
                           external: External | None = None) -> Metrics:
    """The metrics of ``model`` over one held-out set in one harness: greedy (one episode a task at T = 0)
    or sampled (``eval.samples`` a task at ``eval.temperature``, by default the rollouts'); the episodes are kept
    beside them.
    For a harness Orchard does not run, ``external(temperature)`` opens its runner (the policy served for
    the occasion: :mod:`orchard.recipes.cross_harness`) and ``model`` is unused."""
    settings = ctx.settings
    samples, temperature = (1, 0.0) if pass_ == "greedy" else (settings.eval.samples, sampled_temperature(settings))
    tasks: Sequence[Task] = split.held_out[held_out]
    # the rollout settings as this pass runs them: a greedy pass does not depend on the rollouts' temperature
    record = {"pass": pass_, "samples": samples, "rollout": replace(settings.rl.rollout, temperature=temperature),
              "chat_format": settings.chat_format, "seed": settings.seed, "harness": harness_name,
              **family.eval_settings(settings)}
    stage = Stage(eval_directory(root, held_out, harness_name, stage_name, pass_), "eval", record,
                  {**inputs, "tasks": task_ids(tasks)})
    result_path = os.path.join(stage.directory, "result.json")
    if stage.open(ctx.rerun) == "done":
        return read_json(result_path)
    label = family.eval_label(stage_name, pass_, held_out, harness_name)
    if external is not None:
        async with external(temperature) as runner:
            evaluation = await evaluate_policy(runner, tasks, samples, seed=settings.seed, name=label)
    else:
        if model is None or tokenizer is None or harness is None:
            raise ValueError(f"evaluating in {harness_name} needs the policy's model, its tokenizer and the harness")
        chat_format = model_chat_format(settings.chat_format, tokenizer, model)
        policy = make_policy(settings.rl, in_process_engine(settings.rl.engine, model, tokenizer), chat_format,
                             temperature=temperature, **family.policy_options(ctx))
        runner = settings.rl.rollout.runner(ctx.client, harness, policy, setups=ctx.setups, pool=ctx.pool)
        evaluation = await evaluate_policy(runner, tasks, samples, seed=settings.seed, name=label)
    result = {**evaluation.metrics(), **family.eval_metrics(ctx, split, held_out, evaluation)}
    save_trajectories(episodes_path(stage.directory), evaluation.trajectories)
    write_json(result_path, result)
    stage.finish()
    return result


async def evaluate(family: Family, ctx: Context, root: str, split: Split, stage_name: str, passes: Sequence[str],
                   model: Transformer, tokenizer: Tokenizer, policy_made_by: str,
                   harnesses: dict[str, Harness] | None = None) -> HeldOut:
    """Every held-out set of ``split`` that has tasks, in every harness (default: the family's evaluation
    harnesses), in each of ``passes``: set -> harness -> stage -> pass -> metrics."""
    held: HeldOut = {}
    for held_out, tasks in split.held_out.items():
        if not tasks:
            continue
        for name, harness in (harnesses or family.eval_harnesses(ctx)).items():
            held.setdefault(held_out, {}).setdefault(name, {})[stage_name] = {
                pass_: await evaluation_stage(family, ctx, root, split, held_out, name, harness, stage_name, pass_,
                                              model, tokenizer, {"policy": policy_made_by, "tasks": split.made_by})
                for pass_ in passes}
    return held


def merge(into: HeldOut, more: HeldOut) -> None:
    for held_out, harnesses in more.items():
        for harness, stages in harnesses.items():
            into.setdefault(held_out, {}).setdefault(harness, {}).update(stages)


def stage_pairs(stages: Sequence[str]) -> list[tuple[str, str]]:
    """The (before, after) pairs of ``stages`` that a change is reported for: consecutive ones in the runner's
    order, and the first to the last when there are three."""
    present = [s for s in STAGES if s in stages]
    return [*itertools.pairwise(present), *([(present[0], present[-1])] if len(present) > 2 else [])]


def changes(root: str, held: HeldOut) -> dict[str, dict[str, dict[str, dict[str, float]]]]:
    """Per set and harness, the paired per-task change of the sampled pass rate between consecutive stages
    that have one (and from the first to the last when there are three), with its sign test."""
    out: dict[str, dict[str, dict[str, dict[str, float]]]] = {}
    for held_out, harnesses in held.items():
        for harness, stages in harnesses.items():
            out.setdefault(held_out, {})[harness] = {
                f"{after}_vs_{before}": sampled_change(eval_directory(root, held_out, harness, before, "sampled"),
                                                       eval_directory(root, held_out, harness, after, "sampled"))
                for before, after in stage_pairs([s for s in stages if "sampled" in stages[s]])}
    return out


def init_made_by(ctx: Context, tokenizer: Made) -> str:
    """What the freshly initialised policy is made of: the model config, the tokenizer and the seed."""
    return fingerprint({"model": ctx.settings.model, "tokenizer": tokenizer.made_by, "seed": ctx.settings.seed})


def rl_start_policy(family: Family, ctx: Context, tokenizer: Tokenizer, init: str) -> tuple[str, str]:
    """Where RL starts without SFT: ``model.path``, or the freshly initialised model saved once."""
    settings = ctx.settings
    if settings.model.path:  # given, or the copying lessons' policy (then `init` is its fingerprint)
        return resolve(settings.model.path), init if settings.pretrain.num_steps else fingerprint(
            {"model": settings.model.path})
    directory = os.path.join(ctx.workdir, "init_model")
    if not os.path.exists(os.path.join(directory, "config.json")):
        save_pretrained(family.fresh_model(ctx, tokenizer), directory)
        tokenizer.save_pretrained(directory)
    return directory, init


async def run_recipe(family: Family, config: ConfigDict, workdir: str, *, rerun: bool = False) -> RecipeResult:
    """The family's recipe over ``workdir``: tasks, teacher, tokenizer, evaluation at init, SFT, evaluation,
    RL, evaluation, and ``summary.json`` (see the module docstring)."""
    clock = Clock()
    held: HeldOut = {}
    async with open_run(family, config, workdir, rerun) as ctx:
        settings = ctx.settings
        rl_start = "sft" if settings.sft.num_steps else "init"
        ready = await prepare(family, ctx, clock)
        split, tokenizer = ready.split, ready.tokenizer
        init = init_made_by(ctx, ready.tokenizer_made)
        if settings.pretrain.num_steps:
            pretrained = pretrain_stage(settings, workdir, tokenizer, ready.tokenizer_made, rerun)
            clock.lap("pretrain")
            ctx.settings = settings = starting_from(settings, pretrained.directory)
            init = pretrained.made_by
        merge(held, await evaluate(family, ctx, workdir, split, "init", family.passes("init", rl_start),
                                   family.fresh_model(ctx, tokenizer), tokenizer, init))
        clock.lap("evaluate")
        if settings.sft.num_steps:
            policy = family.sft(ctx, workdir, ready.teaching.trajectories, tokenizer, ready.tokenizer_made,
                                {"teacher": ready.teaching.made_by, "tokenizer": ready.tokenizer_made.made_by})
            clock.lap("sft")
            merge(held, await evaluate(family, ctx, workdir, split, "sft", family.passes("sft", rl_start),
                                       trained_policy(settings, policy.directory, ctx.mesh), tokenizer, policy.made_by))
            clock.lap("evaluate")
            policy_dir, policy_made_by = policy.directory, policy.made_by
        else:
            policy_dir, policy_made_by = rl_start_policy(family, ctx, tokenizer, init)
        rl_dir = os.path.join(workdir, "rl")
        await train_rl(settings.rl, rl_dir, ctx.client, split.rl, family.rl_harness(ctx), policy=policy_dir,
                       tokenizer=ready.tokenizer_made.directory,
                       inputs={"policy": policy_made_by, "tasks": split.made_by, "rl_tasks": task_ids(split.rl)},
                       rerun=rerun, **family.rl_options(ctx, split))
        clock.lap("rl")
        merge(held, await evaluate(family, ctx, workdir, split, "rl", family.passes("rl", rl_start),
                                   trained_policy(settings, os.path.join(rl_dir, "model"), ctx.mesh), tokenizer,
                                   made_by(rl_dir)))
        clock.lap("evaluate")
        rl_metrics = read_metrics(rl_dir)
        extras = family.summary_extras(ctx, held, ready.teaching, rl_metrics)
    result = RecipeResult(family=family.name, config_digest=fingerprint(config.to_dict()), tasks=split.counts(),
                          teacher=ready.teaching.summary, held_out=held, changes=changes(workdir, held),
                          rl_metrics=rl_metrics, seconds=clock.seconds, extras=extras)
    write_json(os.path.join(workdir, "summary.json"), result.to_dict())
    return result


def run(family: Family, config: ConfigDict, workdir: str, *, rerun: bool = False) -> RecipeResult:
    """:func:`run_recipe` from synchronous code."""
    return asyncio.run(run_recipe(family, config, workdir, rerun=rerun))

