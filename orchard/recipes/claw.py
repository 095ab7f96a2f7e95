"""Orchard-Claw in one call: generated tasks, teacher trajectories through two harnesses, SFT, GRPO,
and held-out evaluation in both harnesses with the Claw metrics.

:func:`run_recipe` chains the stages over one workdir; each is a :class:`~orchard.workdir.Stage`::

    config.json        the whole resolved config of the last run
    tasks/             train/ and held_out/: one task spec per file (orchard.tasks.claw.generate)
    teacher/           trajectories.jsonl: the teacher's completed episodes in every teacher harness
    tokenizer/         a BPE of the teacher text, tool schemas and calls included
    sft_data/, sft/    examples, checkpoints, metrics, model/ (as the SWE recipe's)
    rl/                GRPO in ``harness.rl``: checkpoints, metrics, model/
    eval/<stage>_<harness>/  result.json and the episodes behind it: stage init, sft or rl; harness
                       one of ``harness.eval``; ``eval.samples`` sampled episodes a held-out task
    summary.json

**Splits.** The generator holds out parameter combinations (:mod:`orchard.tasks.claw.generate`): no
held-out task has a value of its family's held-out parameter that a training task has. The training
tasks are split again by the project's one split, as the SWE recipe's: ``tasks.rl_fraction`` of them
are RL's prompts only and get no teacher trajectories. No setting was chosen on the held-out tasks.

**Stages** (section 3.5 of the notes): the teacher is the oracle (:mod:`orchard.tasks.claw.oracle`:
the reference plan, clean, wandering or recovering from a wrong call, retrying injected faults) in
every harness of ``teacher.harnesses``, the ReAct harness (tool calls) and the shell harness (one
command a turn over the tasks' command-line tools); only completed episodes are kept
(:mod:`orchard.tasks.claw.collect`). SFT trains on all of them. GRPO samples groups in ``harness.rl``
with the binary reward of the task's tests; an episode cut by the wall clock has no reward and is
left out of its group. Every stage's policy is evaluated in each harness of ``harness.eval``,
``eval.samples`` sampled episodes a held-out task at the rollouts' temperature: pass^3, pass@3 (over
the n samples, unbiased), the mean task score and safety violations (:func:`~orchard.eval.claw_score.claw_table`),
and, between stages, the paired per-task change of the pass rate with its sign test.

Departures, at the embedded default's scale: the teacher is the oracle (it knows each task's plan), not
a frontier model; the policy is a tiny model trained from scratch over a BPE of the teacher text; an
episode has a turn cap (``rl.rollout.max_turns``) beside its wall clock, which the paper does not, so
that an untrained policy's episodes end within the CPU budget; GRPO's batch and group are 4 x 4, not 8 x 8.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
import os
from collections.abc import Callable, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field
from typing import Any

from ml_collections import ConfigDict

from orchard.config import fingerprint, from_config
from orchard.data.tokenizer import Tokenizer
from orchard.data.trajectory import Trajectory, read_trajectories, save_trajectories
from orchard.env import AsyncSandboxClient, orchestrator
from orchard.eval.claw_score import claw_table
from orchard.eval.metrics import paired_change
from orchard.eval.runner import Evaluation, evaluate_policy
from orchard.eval.splits import split_by_id
from orchard.harness.claw import ClawHarness, claw_shell_harness
from orchard.harness.core import Harness
from orchard.harness.episode import EpisodeRunner, SandboxPool
from orchard.models.build import build_model
from orchard.models.shipped import resolve
from orchard.models.transformer import Transformer
from orchard.recipes.swe import (
    Clock,
    SharedStages,
    episodes_path,
    message_texts,
    sft_stage,
    shared_stages,
    tokenizer_stage,
    trained_policy,
)
from orchard.rollout.jax_engine import JaxEngine, model_chat_format
from orchard.tasks.claw.collect import collect
from orchard.tasks.claw.generate import generate_tasks, read_tasks, write_tasks
from orchard.tasks.claw.oracle import VARIANTS, plan_teacher
from orchard.tasks.claw.task import ClawTask
from orchard.tasks.swe.sft_data import ExamplesConfig
from orchard.train.metrics import read_metrics
from orchard.train.rl import make_policy, train_rl
from orchard.workdir import Stage, made_by, read_json, write_json

log = logging.getLogger(__name__)
PASS_K = 3  # pass^k and pass@k are reported at k = 3, as the paper's
STAGES = ("init", "sft", "rl")
HARNESSES = {"claw": ClawHarness, "claw-shell": claw_shell_harness}  # name -> factory


def make_harness(name: str) -> Harness:
    """A Claw harness by name (:data:`HARNESSES`)."""
    if name not in HARNESSES:
        raise ValueError(f"unknown Claw harness {name!r}: one of {', '.join(HARNESSES)}")
    return HARNESSES[name]()


@dataclass(frozen=True)
class ClawTasksConfig:
    path: str = ""  # a directory of task specs (train/ and held_out/, as write_tasks writes); empty: generated
    count_per_family: int = 8  # generated tasks of each of the five families
    held_out_share: float = 0.2  # of each family's, from its held-out parameter combinations
    fault_rate: float = 0.1  # the rate the episodes' services inject faults at (429, 500, slow replies)
    rl_fraction: float = 0.25  # of the training tasks: RL's prompts only


@dataclass(frozen=True)
class ClawTeacherConfig:
    samples: int = 3  # episodes per task and harness, the variants in turn
    variants: tuple[str, ...] = VARIANTS
    harnesses: tuple[str, ...] = ("claw", "claw-shell")
    concurrency: int = 4


@dataclass(frozen=True)
class ClawHarnessConfig:
    rl: str = "claw"  # the harness GRPO samples in
    eval: tuple[str, ...] = ("claw", "claw-shell")  # the harnesses every stage's policy is evaluated in
    pool: int = 4  # sandboxes kept between episodes (their services reset per task)


@dataclass(frozen=True)
class ClawConfig(SharedStages):
    """The recipe's typed stage configs, checked when the recipe starts (:func:`claw_config`)."""

    tasks: ClawTasksConfig
    teacher: ClawTeacherConfig
    harness: ClawHarnessConfig
    examples: ExamplesConfig


def claw_config(config: ConfigDict) -> ClawConfig:
    """The stage configs of a ``configs/claw_grpo.py`` config (the shared ones, and the Claw stages')."""
    common, c, examples = shared_stages(config)
    return ClawConfig(
        **common,
        tasks=from_config(ClawTasksConfig, c["tasks"], "tasks"),
        teacher=from_config(ClawTeacherConfig, c["teacher"], "teacher"),
        harness=from_config(ClawHarnessConfig, c["harness"], "harness"),
        examples=from_config(ExamplesConfig, {**examples, "seed": common["seed"], "chat_format": common["chat_format"]},
                             "sft.examples"))


@dataclass
class ClawSplit:
    sft: list[ClawTask]
    rl: list[ClawTask]
    held_out: list[ClawTask]

    def counts(self) -> dict[str, int]:
        return {"sft": len(self.sft), "rl": len(self.rl), "held_out": len(self.held_out)}


@dataclass
class ClawResult:
    held_out: dict[str, dict[str, dict[str, Any]]]  # harness -> stage -> metrics (claw_table's, and the runner's)
    changes: dict[str, dict[str, dict[str, float]]]  # harness -> "sft_vs_init" / "rl_vs_sft" -> paired change
    rl_metrics: dict[int, dict[str, float]]
    tasks: dict[str, int]
    teacher: dict[str, Any]
    seconds: dict[str, float]
    rl_harness: str = "claw"
    per_task: dict[str, dict[str, dict[str, Any]]] = field(default_factory=dict)  # harness -> stage -> claw rows

    def to_dict(self) -> dict[str, Any]:
        return {"held_out": self.held_out, "changes": self.changes,
                "rl_metrics": {str(k): v for k, v in self.rl_metrics.items()}, "tasks": self.tasks,
                "teacher": self.teacher, "seconds": self.seconds, "rl_harness": self.rl_harness,
                "per_task": self.per_task}


def tasks_stage(config: ClawConfig, workdir: str, rerun: bool) -> tuple[ClawSplit, str]:
    """Stage 1: the task specs (a directory, or generated once into ``tasks/``) and their split."""
    tasks = config.tasks
    if tasks.path:
        generated, tasks_made_by = read_tasks(tasks.path), fingerprint({"tasks": os.path.abspath(tasks.path)})
    else:
        generation = {"seed": config.seed, "count_per_family": tasks.count_per_family,
                      "held_out_share": tasks.held_out_share, "fault_rate": tasks.fault_rate}
        stage = Stage(os.path.join(workdir, "tasks"), "tasks", generation)
        if stage.open(rerun) != "done":
            made = generate_tasks(tasks.count_per_family, config.seed, tasks.fault_rate, tasks.held_out_share)
            write_tasks(made, stage.directory)
            stage.finish({"train": len(made.train), "held_out": len(made.held_out),
                          "rejected": dict(made.rejected)})
        generated, tasks_made_by = read_tasks(stage.directory), stage.fingerprint
    if not generated.train or not generated.held_out:
        raise ValueError(f"the Claw recipe needs training and held-out tasks; got {len(generated.train)} and "
                         f"{len(generated.held_out)}")
    sft, rl = split_by_id(generated.train, tasks.rl_fraction, config.seed, key=lambda spec: spec.id,
                          at_least_one=tasks.rl_fraction > 0)
    sft_tasks = [ClawTask(s) for s in sft]  # with rl_fraction = 0, RL samples the SFT tasks
    return ClawSplit(sft_tasks, [ClawTask(s) for s in rl] or sft_tasks,
                     [ClawTask(s) for s in generated.held_out]), tasks_made_by


def _ids(tasks: Sequence[ClawTask]) -> str:
    return fingerprint(sorted(task.id for task in tasks))


async def teacher_stage(config: ClawConfig, workdir: str, client: AsyncSandboxClient, pool: SandboxPool | None,
                        split: ClawSplit, tasks_made_by: str, rerun: bool) -> tuple[list[Trajectory], dict[str, Any], str]:
    """Stage 2: the oracle teacher on every SFT task in every teacher harness; the completed episodes."""
    stage = Stage(os.path.join(workdir, "teacher"), "teacher", config.teacher,
                  {"tasks": tasks_made_by, "sft_tasks": _ids(split.sft)})
    path = os.path.join(stage.directory, "trajectories.jsonl")
    if stage.open(rerun) == "done":
        return list(read_trajectories(path)), stage.summary(), stage.fingerprint
    teacher = config.teacher
    runner = EpisodeRunner(client, concurrency=teacher.concurrency, pool=pool)
    collection = await collect(runner, split.sft, [make_harness(name) for name in teacher.harnesses],
                               plan_teacher(teacher.variants), teacher.samples, seed=config.seed)
    if collection.errors:
        log.warning("%d teacher episodes failed in the environment: %s", len(collection.errors),
                    collection.errors[:3])
    if not collection.kept:
        raise RuntimeError(f"the teacher completed no episode: {collection.summary()}")
    save_trajectories(path, collection.kept)
    summary = collection.summary()
    log.info("teacher: %s", summary)
    stage.finish(summary)
    return collection.kept, summary, stage.fingerprint


@dataclass
class Teaching:
    """What the teacher stage and the tokenizer stage made: the episodes and the tokenizer, with their fingerprints."""

    trajectories: list[Trajectory]
    summary: dict[str, Any]
    made_by: str
    tokenizer: Tokenizer
    tokenizer_dir: str
    tokenizer_made_by: str


async def teaching(config: ClawConfig, workdir: str, client: AsyncSandboxClient, pool: SandboxPool | None,
                   split: ClawSplit, tasks_made_by: str, rerun: bool) -> Teaching:
    """Stages 2 and 3: the teacher's episodes (:func:`teacher_stage`) and the tokenizer over their text."""
    trajectories, summary, made_by = await teacher_stage(config, workdir, client, pool, split, tasks_made_by, rerun)
    tokenizer, directory, tokenizer_made_by = tokenizer_stage(config, workdir, trajectories, made_by, rerun,
                                                              texts=teacher_texts)
    return Teaching(trajectories, summary, made_by, tokenizer, directory, tokenizer_made_by)


def teacher_texts(trajectories: Sequence[Trajectory]) -> list[str]:
    """What the BPE learns from: the messages (system prompts, tool answers and calls included) and
    every distinct tool schema the policy is offered, as the chat template writes them."""
    schemas = sorted({json.dumps(tool, ensure_ascii=False) for t in trajectories for tool in t.tools or ()})
    return [*schemas, *message_texts(trajectories)]


async def evaluation_stage(config: ClawConfig, workdir: str, client: AsyncSandboxClient, pool: SandboxPool | None,
                           name: str, harness: str, model: Transformer | None, tokenizer: Tokenizer | None,
                           tasks: Sequence[ClawTask], inputs: dict[str, str], rerun: bool,
                           external: Callable[[float], AbstractAsyncContextManager[Any]] | None = None
                           ) -> dict[str, Any]:
    """Stage 5: ``eval.samples`` sampled episodes of every held-out task in ``harness`` by ``model``;
    the runner's metrics and the Claw table (pass^3, pass@3, mean score, safety violations, per task).
    For a harness Orchard does not run, ``external(temperature)`` opens its runner (the policy served
    for the occasion: :func:`orchard.recipes.cross_harness.third_party_runner`) and ``model`` is unused."""
    temperature = config.rl.rollout.temperature
    settings = {"samples": config.eval.samples, "temperature": temperature, "rollout": config.rl.rollout,
                "chat_format": config.chat_format, "seed": config.seed, "harness": harness}
    stage = Stage(os.path.join(workdir, "eval", f"{name}_{harness}"), "eval", settings,
                  {**inputs, "tasks": _ids(tasks)})
    result_path = os.path.join(stage.directory, "result.json")
    if stage.open(rerun) == "done":
        return read_json(result_path)
    label = f"eval {name} {harness}"
    if external is not None:
        async with external(temperature) as runner:
            evaluation = await evaluate_policy(runner, tasks, config.eval.samples, seed=config.seed, name=label)
    else:
        if model is None or tokenizer is None:
            raise ValueError(f"evaluating in {harness} needs the policy's model and tokenizer")
        chat_format = model_chat_format(config.chat_format, tokenizer, model)
        policy = make_policy(config.rl, JaxEngine(model, tokenizer), chat_format, temperature=temperature)
        runner = config.rl.rollout.runner(client, make_harness(harness), policy, pool=pool)
        evaluation = await evaluate_policy(runner, tasks, config.eval.samples, seed=config.seed, name=label)
    result = {**evaluation.metrics(), **claw_table(evaluation.trajectories, PASS_K),
              "timed_out": float(sum(t.outcome.status == "timed_out" for t in evaluation.trajectories))}
    save_trajectories(episodes_path(stage.directory), evaluation.trajectories)
    write_json(result_path, result)
    stage.finish()
    return result


def stage_change(workdir: str, harness: str, before: str, after: str) -> dict[str, float]:
    """The paired per-task change of the pass rate (score at least 0.75) in ``harness`` from stage
    ``before`` to ``after``, and its one-sided sign test."""
    rates = [Evaluation.of(list(read_trajectories(episodes_path(os.path.join(workdir, "eval", f"{s}_{harness}")))))
             .task_rates() for s in (before, after)]
    return paired_change(*rates).to_dict()


async def run_recipe(config: ConfigDict, workdir: str, *, rerun: bool = False) -> ClawResult:
    """The stages of Orchard-Claw over ``workdir``; see the module docstring."""
    settings = claw_config(config)
    for name in (*settings.teacher.harnesses, settings.harness.rl, *settings.harness.eval):
        make_harness(name)  # an unknown harness stops the run before anything runs
    os.makedirs(workdir, exist_ok=True)
    write_json(os.path.join(workdir, "config.json"), config)
    clock = Clock()
    split, tasks_made_by = await asyncio.to_thread(tasks_stage, settings, workdir, rerun)  # generation runs its own loop
    clock.lap("tasks")
    held: dict[str, dict[str, dict[str, Any]]] = {name: {} for name in settings.harness.eval}
    with orchestrator(settings.env.url, settings.env.api_key) as endpoint:
        client = endpoint.async_client()
        pool = SandboxPool(settings.harness.pool) if settings.harness.pool else None
        try:
            taught = await teaching(settings, workdir, client, pool, split, tasks_made_by, rerun)
            tokenizer = taught.tokenizer
            clock.lap("collect")

            async def evaluate(name: str, model: Transformer, made_by: str) -> None:
                for harness in settings.harness.eval:
                    held[harness][name] = await evaluation_stage(
                        settings, workdir, client, pool, name, harness, model, tokenizer, split.held_out,
                        {"policy": made_by, "tasks": tasks_made_by}, rerun)

            def policy_model(directory: str) -> Transformer:
                return trained_policy(settings, directory)

            initial = build_model(settings.model, settings.seed, tokenizer.vocab_size)
            await evaluate("init", initial, fingerprint({"model": settings.model, "tokenizer": taught.tokenizer_made_by,
                                                         "seed": settings.seed}))
            del initial
            clock.lap("evaluate")
            policy_dir, policy_made_by = resolve(settings.model.path), fingerprint({"model": settings.model.path})
            if settings.sft.num_steps:
                policy_dir, policy_made_by = sft_stage(settings, workdir, taught.trajectories, tokenizer,
                                                       taught.tokenizer_dir, {"teacher": taught.made_by,
                                                                              "tokenizer": taught.tokenizer_made_by},
                                                       rerun)
                clock.lap("sft")
                await evaluate("sft", policy_model(policy_dir), policy_made_by)
                clock.lap("evaluate")
            rl_dir = os.path.join(workdir, "rl")
            await train_rl(settings.rl, rl_dir, client, split.rl, make_harness(settings.harness.rl), policy=policy_dir,
                           tokenizer=taught.tokenizer_dir, inputs={"policy": policy_made_by, "tasks": tasks_made_by,
                                                            "rl_tasks": _ids(split.rl)}, rerun=rerun, pool=pool)
            clock.lap("rl")
            await evaluate("rl", policy_model(os.path.join(rl_dir, "model")), made_by(rl_dir))
            clock.lap("evaluate")
        finally:
            if pool is not None:
                await pool.close()
            await client.aclose()
    stages = [s for s in STAGES if all(s in held[h] for h in held)]
    pairs = [*itertools.pairwise(stages), *([(stages[0], stages[-1])] if len(stages) > 2 else [])]
    changes = {harness: {f"{after}_vs_{before}": stage_change(workdir, harness, before, after)
                         for before, after in pairs} for harness in settings.harness.eval}
    per_task = {h: {s: metrics.pop("per_task") for s, metrics in by_stage.items()} for h, by_stage in held.items()}
    result = ClawResult(held_out=held, changes=changes, rl_metrics=read_metrics(rl_dir), tasks=split.counts(),
                        teacher=taught.summary, seconds=clock.seconds, rl_harness=settings.harness.rl, per_task=per_task)
    write_json(os.path.join(workdir, "summary.json"), result.to_dict())
    return result


def run(config: ConfigDict, workdir: str, *, rerun: bool = False) -> ClawResult:
    """:func:`run_recipe` from synchronous code."""
    return asyncio.run(run_recipe(config, workdir, rerun=rerun))
