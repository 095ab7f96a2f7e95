"""Orchard-Claw as a task family of the recipe runner: generated tasks, teacher trajectories through two harnesses, SFT, GRPO,
and held-out evaluation in both harnesses with the Claw metrics.

``python experiments/claw_grpo/run.py`` runs it (:mod:`orchard.recipes.runner` has the stages and the
workdir; ``tasks/`` holds ``train/`` and ``held_out/``, one task spec per file).

**Splits.** The generator holds out parameter combinations (:mod:`orchard.tasks.claw.generate`): no
task of the ``held_out`` set has a value of its family's held-out parameter that a training task has;
a family whose rule holds out further axes (the quick actions' unseen cast) gives a ``held_out_<axis>``
set for each, of the tasks only that axis holds out (:func:`held_out_set`).
With ``tasks.held_out_family``, every task of that family is in the ``family`` set instead and none
trains. The training tasks are split again by the project's one split, as the SWE recipe's:
``tasks.validation_share`` of them are the ``validation`` set (evaluated as the held-out sets are, and
the only one settings may be chosen on), and ``tasks.rl_fraction`` of the rest are RL's prompts only,
with no teacher trajectories. The families run from one call (``quick_action``) to whole workflows.

**Stages** (section 3.5 of the notes): the teacher is the oracle (:mod:`orchard.tasks.claw.oracle`:
the reference plan, clean, wandering or recovering from a wrong call, retrying injected faults) in
every harness of ``teacher.harnesses``, the ReAct harness (tool calls) and the shell harness (one
command a turn over the tasks' command-line tools); only completed episodes are kept
(:mod:`orchard.tasks.claw.collect`). SFT trains on all of them. GRPO samples groups in ``harness.rl``
with the binary reward of the task's tests; an episode cut by the wall clock has no reward and is
left out of its group. Every stage's policy is evaluated in each harness of ``harness.eval``,
``eval.samples`` sampled episodes a held-out task at ``eval.temperature`` (default: the rollouts'):
pass^3, pass@3 (over the n samples, unbiased), the mean task score and safety violations
(:func:`~orchard.eval.claw_score.claw_table`), and, between stages, the paired per-task change of the
pass rate with its sign test.

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
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ml_collections import ConfigDict

from orchard.config import fingerprint, from_config
from orchard.data.tokenizer import Tokenizer
from orchard.data.trajectory import Trajectory, read_trajectories, save_trajectories
from orchard.eval.claw_score import claw_table
from orchard.eval.runner import Evaluation
from orchard.eval.splits import split_by_id
from orchard.harness.claw import ClawHarness, claw_shell_harness
from orchard.harness.core import Harness
from orchard.harness.episode import EpisodeRunner, SandboxPool
from orchard.recipes.family import Context, Family, Split, Teaching
from orchard.recipes.sft_data import ExamplesConfig
from orchard.recipes.stages import (
    PROBE_RUNS,
    Made,
    SharedStages,
    copy_probe,
    message_texts,
    shared_stages,
    task_ids,
    text_sft_stage,
)
from orchard.tasks.claw.collect import collect
from orchard.tasks.claw.families import FAMILIES
from orchard.tasks.claw.generate import generate_tasks, read_tasks, write_tasks
from orchard.tasks.claw.oracle import VARIANTS, plan_teacher
from orchard.tasks.claw.renaming import renamed_episodes
from orchard.tasks.claw.spec import ClawTaskSpec
from orchard.tasks.claw.task import ClawTask
from orchard.workdir import Stage

log = logging.getLogger(__name__)
PASS_K = 3  # pass^k and pass@k are reported at k = 3, as the paper's
HARNESSES = {"claw": ClawHarness, "claw-shell": claw_shell_harness}  # name -> factory
TOOL_FORMATS = ("qwen3",)  # chat formats that write tool schemas and calls (the ReAct harness needs them)


def make_harness(name: str) -> Harness:
    """A Claw harness by name (:data:`HARNESSES`)."""
    if name not in HARNESSES:
        raise ValueError(f"unknown Claw harness {name!r}: one of {', '.join(HARNESSES)}")
    return HARNESSES[name]()


@dataclass(frozen=True)
class ClawTasksConfig:
    path: str = ""  # a directory of task specs (train/ and held_out/, as write_tasks writes); empty: generated
    count_per_family: int = 8  # generated tasks of each family
    families: tuple[str, ...] = ()  # the families generated (orchard.tasks.claw.families.FAMILIES); empty: all
    held_out_share: float = 0.2  # of each family's, from its held-out parameter combinations
    fault_rate: float = 0.1  # the rate the episodes' services inject faults at (429, 500, slow replies)
    rl_fraction: float = 0.25  # of the training tasks: RL's prompts only
    # A family none of whose tasks trains: the "family" held-out set (empty: none). Its tasks test the
    # calls the other families train, chained in a workflow no training task shows.
    held_out_family: str = ""
    validation_share: float = 0.0  # of the training tasks: the "validation" set, where settings are chosen


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


def held_out_set(spec: ClawTaskSpec) -> str:
    """The set of a task its parameters hold out: ``held_out`` where its family's main axis does (and for a
    family the generator does not know), ``held_out_<axis>`` where another axis of the family's rule does."""
    family = FAMILIES.get(spec.family)
    if family is None or not set(family.HELD_OUT.axes) <= set(spec.params):
        return "held_out"
    axis = family.HELD_OUT.axis_of(spec.params)
    return "held_out" if axis in (None, family.HELD_OUT.param) else f"held_out_{axis}"


def tasks_stage(config: ClawConfig, workdir: str, rerun: bool) -> Split:
    """The task specs (a directory, or generated once into ``tasks/``) and their split."""
    tasks = config.tasks
    if tasks.path:
        generated, tasks_made_by = read_tasks(tasks.path), fingerprint({"tasks": os.path.abspath(tasks.path)})
    else:
        generation = {"seed": config.seed, "count_per_family": tasks.count_per_family,
                      "held_out_share": tasks.held_out_share, "fault_rate": tasks.fault_rate,
                      "families": list(tasks.families or FAMILIES)}
        stage = Stage(os.path.join(workdir, "tasks"), "tasks", generation)
        if stage.open(rerun) != "done":
            made = generate_tasks(tasks.count_per_family, config.seed, tasks.fault_rate, tasks.held_out_share,
                                  tasks.families or None)
            write_tasks(made, stage.directory)
            stage.finish({"train": len(made.train), "held_out": len(made.held_out),
                          "rejected": dict(made.rejected)})
        generated, tasks_made_by = read_tasks(stage.directory), stage.fingerprint
    family = tasks.held_out_family
    train = [spec for spec in generated.train if spec.family != family]
    by_params: dict[str, list[ClawTaskSpec]] = {}
    for spec in generated.held_out:
        if spec.family != family:
            by_params.setdefault(held_out_set(spec), []).append(spec)
    by_family = [spec for spec in generated.train + generated.held_out if spec.family == family]
    if not train or not by_params:
        raise ValueError(f"the Claw recipe needs training and held-out tasks; got {len(train)} and "
                         f"{sum(map(len, by_params.values()))}")
    if family and not by_family:
        raise ValueError(f"tasks.held_out_family: no task of the family {family!r}")
    train, validation = split_by_id(train, tasks.validation_share, config.seed, key=lambda spec: spec.id,
                                    purpose="validation", at_least_one=tasks.validation_share > 0)
    sft, rl = split_by_id(train, tasks.rl_fraction, config.seed, key=lambda spec: spec.id, purpose="rl-prompts",
                          at_least_one=tasks.rl_fraction > 0)
    sft_tasks = [ClawTask(s) for s in sft]  # with rl_fraction = 0, RL samples the SFT tasks
    held_out = {"validation": validation, **dict(sorted(by_params.items())), "family": by_family}
    made_by = fingerprint({"tasks": tasks_made_by, "held_out_family": family,
                           "validation_share": tasks.validation_share, "rl_fraction": tasks.rl_fraction})
    return Split(sft=sft_tasks, rl=[ClawTask(s) for s in rl] or sft_tasks,
                 held_out={name: [ClawTask(s) for s in specs] for name, specs in held_out.items() if specs},
                 made_by=made_by)


async def teacher_stage(ctx: Context, split: Split) -> Teaching:
    """The oracle teacher on every SFT task in every teacher harness; the completed episodes."""
    config: ClawConfig = ctx.settings
    stage = Stage(os.path.join(ctx.workdir, "teacher"), "teacher", config.teacher,
                  {"tasks": split.made_by, "sft_tasks": task_ids(split.sft)})
    path = os.path.join(stage.directory, "trajectories.jsonl")
    if stage.open(ctx.rerun) == "done":
        return Teaching(list(read_trajectories(path)), stage.summary(), stage.fingerprint)
    teacher = config.teacher
    runner = EpisodeRunner(ctx.client, concurrency=teacher.concurrency, pool=ctx.pool)
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
    return Teaching(collection.kept, summary, stage.fingerprint)


def probe_pairs(trajectories: Sequence[Trajectory], specs: dict[str, ClawTaskSpec], seed: int,
                renamings: int) -> list[tuple[Trajectory, Trajectory]]:
    """The copy probe's episodes (:func:`~orchard.recipes.stages.copy_probe`): up to :data:`PROBE_RUNS` passed
    teacher episodes of tasks that invented their cast, each with its copy renamed at an index
    (``renamings``) no SFT row used."""
    pairs = ((run, renamed) for run in trajectories if run.outcome.resolved
             for renamed in renamed_episodes([run], specs, seed, 1, first=renamings))
    return list(itertools.islice(pairs, PROBE_RUNS))  # renames no more episodes than it keeps


class ClawFamily(Family):
    name = "claw"
    # a text policy's
    unread_fields = ("sft.images_per_row", "rl.context_images", "rl.images_per_row")
    title = "Orchard-Claw: held-out tasks"
    measures = ("pass_hat_k", "pass_at_k", "mean_score", "safety_violations")

    def typed(self, config: ConfigDict) -> ClawConfig:
        return claw_config(config)

    def check(self, config: ClawConfig) -> list[str]:
        problems = []
        tasks, teacher = config.tasks, config.teacher
        if not tasks.path and tasks.count_per_family < 2:
            problems.append("tasks.count_per_family must be at least 2 (a training and a held-out task of each family)")
        for name in ("held_out_share", "rl_fraction", "validation_share"):
            if not 0.0 <= getattr(tasks, name) < 1.0:
                problems.append(f"tasks.{name} must be in [0, 1), got {getattr(tasks, name)}")
        if unknown := sorted(set(tasks.families) - set(FAMILIES)):
            problems.append(f"tasks.families: {unknown} are not Claw families: {', '.join(FAMILIES)}")
        if tasks.held_out_family and tasks.held_out_family not in (tasks.families or FAMILIES):
            problems.append(f"tasks.held_out_family {tasks.held_out_family!r} is not one of the generated "
                            f"families: {', '.join(tasks.families or FAMILIES)}")
        if not 0.0 <= tasks.fault_rate <= 1.0:
            problems.append(f"tasks.fault_rate must be in [0, 1], got {tasks.fault_rate}")
        if unknown := [h for h in (*teacher.harnesses, config.harness.rl, *config.harness.eval) if h not in HARNESSES]:
            problems.append(f"harnesses {unknown} are not Claw harnesses: {', '.join(HARNESSES)}")
        if unknown := [v for v in teacher.variants if v not in VARIANTS]:
            problems.append(f"teacher.variants {unknown} are not among {', '.join(VARIANTS)}")
        if (config.sft.num_steps or not config.tokenizer.path) and not (teacher.samples and teacher.harnesses):
            problems.append("teacher: SFT and a trained tokenizer need teacher episodes (teacher.samples and harnesses)")
        if not config.sft.num_steps and not config.model.path:
            problems.append("model: without SFT, RL starts from model.path, which is empty")
        if not config.tokenizer.path and config.tokenizer.train_vocab < 260:
            problems.append("tokenizer: set tokenizer.path, or tokenizer.train_vocab >= 260 (256 bytes + specials)")
        if config.chat_format not in TOOL_FORMATS:
            problems.append(f"chat.format must write tool calls: one of {', '.join(TOOL_FORMATS)}, got "
                            f"{config.chat_format!r}")
        families = tasks.families or tuple(FAMILIES)
        if config.examples.renamings and not any(hasattr(FAMILIES.get(f), "recast") for f in families):
            problems.append("sft.examples.renamings renames the casts that tasks invent: none of the families "
                            f"{', '.join(families)} invents one (quick_action does)")
        if config.eval.samples < PASS_K:
            problems.append(f"eval.samples must be at least {PASS_K}: pass^{PASS_K} and pass@{PASS_K} need as many "
                            "episodes a task")
        return problems

    def open(self, ctx: Context) -> None:
        pool = ctx.settings.harness.pool
        ctx.pool = SandboxPool(pool) if pool else None

    async def tasks(self, ctx: Context) -> Split:
        return await asyncio.to_thread(tasks_stage, ctx.settings, ctx.workdir, ctx.rerun)  # generation runs its own loop

    async def teach(self, ctx: Context, split: Split) -> Teaching:
        return await teacher_stage(ctx, split)

    def tokenizer_texts(self, trajectories: Sequence[Trajectory]) -> list[str]:
        """The messages (system prompts, tool answers and calls included) and every distinct tool schema the
        policy is offered, as the chat template writes them."""
        schemas = sorted({json.dumps(tool, ensure_ascii=False) for t in trajectories for tool in t.tools or ()})
        return [*schemas, *message_texts(trajectories)]

    def sft(self, ctx: Context, workdir: str, trajectories: Sequence[Trajectory], tokenizer: Tokenizer,
            tokenizer_made: Made, inputs: dict[str, str]) -> Made:
        """SFT on the teacher's episodes and ``sft.examples.renamings`` renamed copies of each whose task invented
        its cast; with copies, the copy probe of the policy after it."""
        settings = ctx.settings
        renamings = settings.examples.renamings
        specs = {task.spec.id: task.spec for task in tasks_stage(settings, ctx.workdir, False).sft} if renamings else {}
        renamed = renamed_episodes(trajectories, specs, settings.seed, renamings)
        policy = text_sft_stage(settings, workdir, settings.examples, [*trajectories, *renamed], tokenizer,
                                tokenizer_made.directory, inputs, ctx.rerun)
        if renamed:  # whether the policy copies names it cannot have seen (a diagnostic)
            copy_probe(settings, settings.examples, workdir, policy.directory,
                       probe_pairs(trajectories, specs, settings.seed, renamings), tokenizer, ctx.mesh)
        return policy

    def eval_harnesses(self, ctx: Context) -> dict[str, Harness]:
        return {name: make_harness(name) for name in ctx.settings.harness.eval}

    def passes(self, stage: str, rl_start: str) -> tuple[str, ...]:
        return ("sampled",)  # pass^k and pass@k at every stage

    def eval_label(self, stage: str, pass_: str, held_out: str, harness: str) -> str:
        return f"eval {stage} {harness}"

    def eval_metrics(self, ctx: Context, split: Split, held_out: str, evaluation: Evaluation) -> dict[str, Any]:
        return {**claw_table(evaluation.trajectories, PASS_K),
                "timed_out": float(sum(t.outcome.status == "timed_out" for t in evaluation.trajectories))}

    def rl_harness(self, ctx: Context) -> Harness:
        return make_harness(ctx.settings.harness.rl)

    def rl_options(self, ctx: Context, split: Split) -> dict[str, Any]:
        return {"pool": ctx.pool}

    def summary_extras(self, ctx: Context, held_out: dict[str, Any], teaching: Teaching,
                       rl_metrics: dict[int, dict[str, float]]) -> dict[str, Any]:
        per_task = {name: {h: {s: passes["sampled"].pop("per_task", {}) for s, passes in stages.items()}
                           for h, stages in harnesses.items()} for name, harnesses in held_out.items()}
        return {"rl_harness": ctx.settings.harness.rl, "per_task": per_task}


CLAW = ClawFamily()
