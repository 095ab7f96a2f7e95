"""Orchard-SWE as a task family of the recipe runner: generated bug-fix tasks, the oracle teacher in the
bash harness, credit-assignment SFT, BAR RL, and two held-out sets.

``python experiments/swe_bar/run.py`` runs it (:mod:`orchard.recipes.runner` has the stages and the
workdir). Two held-out sets are evaluated apart (:mod:`orchard.tasks.swe.taskset`), and no bug of
either is seen in collection, SFT or RL. ``held_out`` is split by task instance: another bug of the
same function may be in training (the held-out instances whose failing test no training instance has
are also reported apart, ``unseen_test_*``). ``held_out_helpers`` is split by helper: every bug of those
functions is held out. The training instances are split again, as in the paper, whose RL set is
instances not used in SFT: ``tasks.rl_fraction`` of them get no teacher trajectories and are RL's
prompts (with ``rl_fraction=0``, RL samples the SFT instances). With ``rl.pass_filter.samples``, RL
keeps the ones whose pass rate under the SFT policy is in (0, 0.5], as the paper's RL set does.

Departures from the paper, at the embedded default's scale: the teacher is the oracle teacher
(:mod:`orchard.tasks.swe.oracle`, which knows the gold patch) instead of frontier models, its
trajectories are brief (search, read, edit, submit), and the policy is a tiny model trained from
scratch over a BPE learnt from the teacher text, so SFT teaches the whole skill and not only its
credit assignment; for the same reason its loss also weighs the tool output the policy is shown
(``sft.examples.observation_weight``, :mod:`orchard.data.examples`). The default runs RL without
the pass-rate filter: its rollouts would cost a minute of the budget, and BAR's strides already spend
more rollouts on prompts whose groups have no variance.
"""

from __future__ import annotations

import functools
import logging
import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ml_collections import ConfigDict

from orchard.config import fingerprint, from_config
from orchard.data.chat import CHAT_FORMATS
from orchard.data.tokenizer import Tokenizer
from orchard.data.trajectory import Trajectory, read_trajectories, save_trajectories
from orchard.eval.runner import Evaluation
from orchard.harness.bash import BashHarness
from orchard.harness.core import Harness, Limits
from orchard.harness.episode import SetupCache
from orchard.recipes.family import Context, Family, Split, Teaching
from orchard.recipes.sft_data import ExamplesConfig
from orchard.recipes.stages import (
    PROBE_RUNS,
    Made,
    SharedStages,
    copy_probe,
    shared_stages,
    task_ids,
    text_sft_stage,
)
from orchard.tasks.swe.collect import CollectionConfig, collect
from orchard.tasks.swe.diffs import parse_patch
from orchard.tasks.swe.instance import SWEInstance, load_instances
from orchard.tasks.swe.oracle import VARIANTS as ORACLE_VARIANTS
from orchard.tasks.swe.skills import renamed_runs, split_by_skill
from orchard.tasks.swe.task import swe_tasks
from orchard.tasks.swe.taskset import GENERATION_FIELDS, TaskSetConfig, make_task_set, split_task_set
from orchard.workdir import Stage, file_fingerprint, read_json

log = logging.getLogger(__name__)
HELD_OUT_SUFFIX = {"held_out": "", "held_out_helpers": " helpers"}  # a held-out set -> its evaluations' seed purpose


@dataclass(frozen=True)
class SWEConfig(SharedStages):
    """The recipe's typed stage configs, each checked when the recipe starts (:func:`swe_config`)."""

    tasks: TaskSetConfig
    teacher: CollectionConfig
    examples: ExamplesConfig


def swe_config(config: ConfigDict) -> SWEConfig:
    """The stage configs of a ``configs/swe_bar.py`` config (:func:`shared_stages`, and the SWE stages')."""
    common, c, examples = shared_stages(config)
    return SWEConfig(
        **common,
        tasks=from_config(TaskSetConfig, c["tasks"], "tasks"),
        teacher=from_config(CollectionConfig, c["teacher"], "teacher"),
        examples=from_config(ExamplesConfig, {**examples, "seed": common["seed"], "chat_format": common["chat_format"]},
                             "sft.examples"))


def tasks_fingerprint(instances_made_by: str, tasks: TaskSetConfig) -> str:
    """What the tasks are made of: their instances and, with ``tasks.repair_tool``, that tool (the prompts and the
    sandboxes differ, so every stage that runs the tasks must rerun when it is turned on or off)."""
    return fingerprint({"tasks": instances_made_by, "repair_tool": True}) if tasks.repair_tool else instances_made_by


def tasks_stage(config: SWEConfig, workdir: str, rerun: bool) -> Split:
    """The instances (a file, or generated once into ``tasks/``) and their split."""
    if config.tasks.path:
        instances = make_task_set(config.tasks, "", config.seed)
        tasks_made_by = file_fingerprint(config.tasks.path)
    else:
        generation = {"seed": config.seed, **{name: getattr(config.tasks, name) for name in GENERATION_FIELDS}}
        if config.tasks.is_procedural:
            generation["procedural"] = config.tasks.procedural
        stage = Stage(os.path.join(workdir, "tasks"), "tasks", generation)
        if stage.open(rerun) == "done":
            instances = load_instances(os.path.join(stage.directory, "instances.jsonl"))
        else:
            instances = make_task_set(config.tasks, stage.directory, config.seed)
            stage.finish({"instances": len(instances)})
        tasks_made_by = stage.fingerprint
    tasks_of = functools.partial(swe_tasks, repair_tool=config.tasks.repair_tool)
    tasks_made_by = tasks_fingerprint(tasks_made_by, config.tasks)
    if config.tasks.is_procedural:
        skills = split_by_skill(instances, config.tasks.procedural, config.seed, config.tasks.rl_fraction)
        log.info("skill split: combos held out %s; dropped %s", skills.combos, skills.dropped)
        held_out = {"validation": skills.validation, **skills.held_out}
        return Split(sft=tasks_of(skills.sft), rl=tasks_of(skills.rl or skills.sft),
                     held_out={name: tasks_of(tasks) for name, tasks in held_out.items() if tasks},
                     made_by=tasks_made_by, extras={"unseen": frozenset(), "rl_tasks": len(skills.rl)})
    split = split_task_set(instances, config.tasks, config.seed)
    return Split(sft=tasks_of(split.sft), rl=tasks_of(split.rl_prompts),
                 held_out={"held_out": tasks_of(split.held_out), "held_out_helpers": tasks_of(split.held_out_helpers)},
                 made_by=tasks_made_by, extras={"unseen": split.unseen, "rl_tasks": len(split.rl)})


async def teacher_stage(ctx: Context, split: Split, harnesses: Sequence[Harness] = (BashHarness(),)) -> Teaching:
    """``teacher.samples`` graded teacher episodes of every SFT task in each harness."""
    config: SWEConfig = ctx.settings
    names = [h.name for h in harnesses]
    stage = Stage(os.path.join(ctx.workdir, "teacher"), "teacher", config.teacher,
                  {"tasks": split.made_by, "instances": task_ids(split.sft),
                   **({"harnesses": ",".join(names)} if names != ["bash"] else {})})
    path = os.path.join(stage.directory, "trajectories.jsonl")
    if stage.open(ctx.rerun) == "done":
        return Teaching(list(read_trajectories(path)), stage.summary(), stage.fingerprint)
    teacher = config.teacher
    report = await collect(ctx.client, split.sft, list(harnesses), teacher.teacher(), teacher.samples,
                           limits=Limits(max_turns=teacher.max_turns), concurrency=teacher.concurrency,
                           seed=config.seed, setups=ctx.setups)
    if report.errors:
        log.warning("%d teacher episodes failed: %s", len(report.errors), report.errors[:3])
    save_trajectories(path, report.kept)
    log.info("teacher: %s", report.summary())
    stage.finish(report.summary())
    return Teaching(report.kept, report.summary(), stage.fingerprint)


def localisation_rates(trajectories: Sequence[Trajectory], instances: dict[str, SWEInstance]) -> dict[str, float]:
    """How far episodes got on the way to a fix, as shares of the episodes (diagnostics for a resolve rate
    that does not move): the first action names the failing test's file (copied from the task), some action
    names the buggy file, some action names the buggy function."""
    first_names_test = names_file = names_function = 0
    for trajectory in trajectories:
        instance = instances[trajectory.task_id]
        actions = [(m.content or "") + " ".join(str(call.arguments) for call in m.tool_calls or ())
                   for m in trajectory.messages if m.role == "assistant"]
        test_file = instance.FAIL_TO_PASS[0].split("::", 1)[0] if instance.FAIL_TO_PASS else None
        path = instance.metadata.get("path") or parse_patch(instance.patch)[0].path
        function = str(instance.metadata.get("function", "")).rsplit(".", 1)[-1]
        first_names_test += bool(actions and test_file and test_file in actions[0])
        names_file += any(path in action for action in actions)
        names_function += bool(function) and any(function in action for action in actions)
    count = max(1, len(trajectories))
    return {"first_action_names_failing_test": first_names_test / count, "names_buggy_file": names_file / count,
            "names_buggy_function": names_function / count}


def probe_pairs(settings: SWEConfig, trajectories: Sequence[Trajectory]) -> list[tuple[Trajectory, Trajectory]]:
    """The copy probe's runs (:func:`~orchard.recipes.stages.copy_probe`): up to :data:`PROBE_RUNS` resolved
    teacher runs on generated repositories, each with its copy renamed at an index no SFT row used."""
    return [(run, renamed) for run in [t for t in trajectories if t.outcome.resolved][:PROBE_RUNS]
            for renamed in renamed_runs([run], settings.tasks.procedural, settings.seed, 1,
                                        first=settings.examples.renamings)]


class SWEFamily(Family):
    """``teacher_harnesses``: the harnesses the teacher runs in (the cross-harness study's two; the main
    job's bash harness)."""

    name = "swe"
    unread_fields = ("sft.images_per_row", "rl.context_images", "rl.images_per_row")  # a text policy's
    title = "Orchard-SWE: held-out resolve rate"

    def __init__(self, teacher_harnesses: Sequence[Harness] = (BashHarness(),)) -> None:
        self.teacher_harnesses = tuple(teacher_harnesses)

    def typed(self, config: ConfigDict) -> SWEConfig:
        return swe_config(config)

    def check(self, config: SWEConfig) -> list[str]:
        problems = []
        tasks, teacher, rl = config.tasks, config.teacher, config.rl
        if not tasks.path and not tasks.sources:
            problems.append("tasks: set tasks.path (instances.jsonl) or tasks.sources")
        if tasks.is_procedural:
            try:
                tasks.procedural.check()
            except ValueError as error:
                problems.append(str(error))
        if not teacher.url:
            if unknown := [v for v in teacher.variants if v not in ORACLE_VARIANTS]:
                problems.append(f"teacher.variants {unknown} are not among {', '.join(ORACLE_VARIANTS)}")
            if teacher.brief and (rerunning := [v for v in teacher.variants if v in ("recover", "search")]):
                problems.append(f"teacher.variants: {', '.join(rerunning)} rerun the tests, which teacher.brief leaves "
                                "out")
        if config.examples.renamings and not tasks.is_procedural:
            problems.append("sft.examples.renamings renames generated repositories: it needs tasks.sources = "
                            "('procedural',)")
        if rl.pass_filter.samples and not 0.0 <= rl.pass_filter.low < rl.pass_filter.high <= 1.0:
            problems.append("rl.pass_filter: need 0 <= low < high <= 1")
        for name in ("held_out_helper_fraction", "held_out_fraction", "rl_fraction"):
            if not 0.0 <= getattr(tasks, name) < 1.0:
                problems.append(f"tasks.{name} must be in [0, 1), got {getattr(tasks, name)}")
        if not config.tokenizer.path and config.tokenizer.train_vocab < 260:
            problems.append("tokenizer: set tokenizer.path, or tokenizer.train_vocab >= 260 (256 bytes + specials)")
        if not config.tokenizer.path and not teacher.samples:
            problems.append("tokenizer: a trained tokenizer needs teacher text (teacher.samples > 0)")
        if config.sft.num_steps and not teacher.samples:
            problems.append("sft: SFT needs teacher trajectories (teacher.samples > 0), or set sft.num_steps = 0")
        if not config.sft.num_steps and not config.model.path:
            problems.append("model: without SFT, RL starts from model.path, which is empty")
        if config.chat_format not in CHAT_FORMATS:
            problems.append(f"chat.format must be one of {tuple(CHAT_FORMATS)}, got {config.chat_format!r}")
        if config.eval.samples < 1:
            problems.append("eval.samples (sampled held-out episodes per task) must be at least 1")
        return problems

    def open(self, ctx: Context) -> None:
        ctx.setups = SetupCache(ctx.client)  # every episode of a task forks one set-up of it

    async def tasks(self, ctx: Context) -> Split:
        return tasks_stage(ctx.settings, ctx.workdir, ctx.rerun)

    def teaches(self, settings: SWEConfig) -> bool:
        return bool(settings.teacher.samples)

    async def teach(self, ctx: Context, split: Split) -> Teaching:
        return await teacher_stage(ctx, split, self.teacher_harnesses)

    def sft(self, ctx: Context, workdir: str, trajectories: Sequence[Trajectory], tokenizer: Tokenizer,
            tokenizer_made: Made, inputs: dict[str, str]) -> Made:
        settings = ctx.settings
        renamed = renamed_runs(trajectories, settings.tasks.procedural, settings.seed,
                               settings.examples.renamings) if settings.examples.renamings else []
        policy = text_sft_stage(settings, workdir, settings.examples, [*trajectories, *renamed], tokenizer,
                                tokenizer_made.directory, inputs, ctx.rerun)
        if settings.tasks.is_procedural:  # whether the policy copies names it cannot have seen (a diagnostic)
            copy_probe(settings, settings.examples, workdir, policy.directory, probe_pairs(settings, trajectories),
                       tokenizer, ctx.mesh)
        return policy

    def eval_harnesses(self, ctx: Context) -> dict[str, Harness]:
        return {"bash": BashHarness()}

    def eval_label(self, stage: str, pass_: str, held_out: str, harness: str) -> str:
        suffix = HELD_OUT_SUFFIX.get(held_out, f" {held_out}") + ("" if harness == "bash" else f" {harness}")
        return f"eval {stage} {pass_}{suffix}"

    def eval_metrics(self, ctx: Context, split: Split, held_out: str, evaluation: Evaluation) -> dict[str, Any]:
        metrics = localisation_rates(evaluation.trajectories, {t.id: t.instance for t in split.held_out[held_out]})
        if held_out != "held_out":
            return metrics
        apart = [t.outcome.resolved for t in evaluation.trajectories if t.task_id in split.extras["unseen"]]
        return {**metrics, "unseen_test_episodes": float(len(apart)),
                "unseen_test_resolve_rate": sum(apart) / len(apart) if apart else 0.0}

    def rl_options(self, ctx: Context, split: Split) -> dict[str, Any]:
        return {"setups": ctx.setups}

    def summary_extras(self, ctx: Context, held_out: dict[str, Any], teaching: Teaching,
                       rl_metrics: dict[int, dict[str, float]]) -> dict[str, Any]:
        probe = os.path.join(ctx.workdir, "sft", "copy_probe.json")
        return {"copy_probe": read_json(probe)} if os.path.exists(probe) else {}


SWE = SWEFamily()
