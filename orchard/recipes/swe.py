"""Orchard-SWE in one call: tasks, teacher trajectories, credit-assignment SFT, BAR RL, held-out eval.

:func:`run_recipe` chains the library's stages over one workdir; each is a
:class:`~orchard.workdir.Stage` (its folder records the config and inputs that made it)::

    config.json         the whole resolved config of the last run
    tasks/              instances.jsonl, repos/       (orchard.tasks.swe.taskset)
    teacher/            trajectories.jsonl            (orchard.tasks.swe.collect, graded in sandboxes)
    tokenizer/          a BPE trained on the teacher text, unless the config names one
    sft_data/           train.jsonl, eval.jsonl       (orchard.tasks.swe.sft_data)
    sft/                checkpoints, metrics, model/  (orchard.train.sft)
    rl/                 checkpoints, metrics, model/  (orchard.train.rl, over SWETask)
    eval/<stage>_<pass>/  result.json and the episodes behind it (orchard.eval.runner): stage
                        init, sft or rl; pass greedy or sampled; over the held-out instances
    eval/<stage>_<pass>_helpers/  the same over the held-out helpers
    summary.json

A stage whose record matches the config and its inputs is reused, a killed SFT or RL stage
resumes from its checkpoints, and a stage made by another config (or from other inputs) stops the
run with the fields that changed, unless ``rerun`` redoes it and the stages after it.

Two held-out sets are evaluated apart (:mod:`orchard.tasks.swe.taskset`), and no bug of either is
seen in collection, SFT or RL. ``held_out`` is split by task instance: another bug of the same
function may be in training (the held-out instances whose failing test no training instance has are
also reported apart). ``held_out_helpers`` is split by helper: every bug of those functions is held
out, so none of them was seen broken in training. Every stage's policy is evaluated greedily on
each, one episode a task, as resolve rates are usually reported; the policies RL starts from and
ends with are also evaluated sampled, ``eval.samples`` episodes a task at ``rl.rollout.temperature``
(avg@k, pass@k, pass^k): that is the rate RL's reward optimises, and the paired per-task change
between the two is summarised with its sign test (:func:`~orchard.eval.metrics.paired_change`).

The training instances are split again, as in the paper, whose RL set is instances not used in
SFT: ``tasks.rl_fraction`` of them get no teacher trajectories and are RL's prompts (with
``rl_fraction=0``, RL samples the SFT instances). With ``rl.pass_filter.samples``, RL keeps the
ones whose pass rate under the SFT policy is in (0, 0.5], as the paper's RL set does
(:func:`orchard.train.rl.filter_by_pass_rate`).

Departures from the paper, at the embedded default's scale: the teacher is the oracle teacher
(:mod:`orchard.tasks.swe.oracle`, which knows the gold patch) instead of frontier models, its
trajectories are brief (search, read, edit, submit), and the policy is a tiny model trained from
scratch over a BPE learnt from the teacher text, so SFT teaches the whole skill and not only its
credit assignment; for the same reason its loss also weighs the tool output the policy is shown
(``sft.examples.observation_weight``, :mod:`orchard.data.examples`). The default runs RL without
the pass-rate filter: its rollouts (4 of each of the 29 prompts) would cost a minute of the budget,
and BAR's strides already spend more rollouts on prompts whose groups have no variance.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import time
from collections.abc import Callable, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from jax.sharding import Mesh
from ml_collections import ConfigDict

from orchard.config import fingerprint, from_config
from orchard.data.chat import make_chat_format
from orchard.data.tokenizer import Tokenizer
from orchard.data.trajectory import Trajectory, read_trajectories, save_trajectories
from orchard.env import AsyncSandboxClient, orchestrator
from orchard.eval.metrics import paired_change
from orchard.eval.runner import Evaluation, evaluate_policy
from orchard.harness.adapters.external import ExternalHarness
from orchard.harness.bash import BashHarness
from orchard.harness.core import Harness, Limits
from orchard.harness.episode import SetupCache
from orchard.models.build import ModelSpec, build_model
from orchard.models.sharding import MeshConfig
from orchard.models.shipped import resolve
from orchard.models.transformer import Transformer
from orchard.rollout.jax_engine import JaxEngine
from orchard.tasks.swe.collect import CollectionConfig, collect
from orchard.tasks.swe.instance import SWEInstance, load_instances
from orchard.tasks.swe.sft_data import ExamplesConfig, build_examples
from orchard.tasks.swe.task import swe_tasks
from orchard.tasks.swe.taskset import (
    GENERATION_FIELDS,
    TaskSetConfig,
    TaskSplit,
    make_task_set,
    split_task_set,
)
from orchard.train.metrics import read_metrics
from orchard.train.rl import RLConfig, make_policy, train_rl
from orchard.train.sft import SFTConfig, train_and_evaluate
from orchard.workdir import Stage, file_fingerprint, made_by, read_json, write_json

log = logging.getLogger(__name__)
PASSES = ("greedy", "sampled")
HELD_OUT = {"held_out": "", "held_out_helpers": "_helpers"}  # a held-out set -> its eval folders' suffix


@dataclass(frozen=True)
class TokenizerConfig:
    path: str = ""  # a tokenizer (an HF directory, a .gguf, "smollm2"); empty: train one on the teacher text
    train_vocab: int = 2048


@dataclass(frozen=True)
class EvalConfig:
    samples: int = 8  # sampled episodes a held-out task, at the rollouts' temperature


@dataclass(frozen=True)
class EnvConfig:
    url: str = ""  # the orchestrator; empty: a local one started for the run
    api_key: str = ""  # its key; empty: $ORCHARD_API_KEY
    backend: Literal["local", "kubernetes"] = "local"


@dataclass(frozen=True)
class SharedStages:
    """The typed stage configs every recipe config holds (:func:`shared_stages`); each recipe's config
    adds its own (its tasks, teacher, examples...)."""

    seed: int
    tokenizer: TokenizerConfig
    chat_format: str
    model: ModelSpec
    mesh: MeshConfig
    sft: SFTConfig
    rl: RLConfig
    eval: EvalConfig
    env: EnvConfig


@dataclass(frozen=True)
class SWEConfig(SharedStages):
    """The recipe's typed stage configs, each checked when the recipe starts (:func:`swe_config`)."""

    tasks: TaskSetConfig
    teacher: CollectionConfig
    examples: ExamplesConfig


def shared_stages(config: ConfigDict) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    """The stage configs every recipe config holds, typed: the seed and chat format (set once at the
    top), the tokenizer, model, mesh, SFT, RL, eval and env blocks (the seed, chat format, mesh and
    model's compute settings, dtypes included, copied into the stages that use them); and the config as a dict and its
    ``sft.examples`` block, for the recipe's own stages."""
    c = config.to_dict()
    sft = dict(c["sft"])
    examples = sft.pop("examples")
    seed, chat_format = c["seed"], c["chat"]["format"]
    model = from_config(ModelSpec, c["model"], "model")
    common = dict(
        seed=seed, chat_format=chat_format,
        tokenizer=from_config(TokenizerConfig, c["tokenizer"], "tokenizer"),
        model=model,
        mesh=from_config(MeshConfig, c["mesh"], "mesh"),
        sft=from_config(SFTConfig, {**sft, "seed": seed, "mesh": c["mesh"], "model": c["model"]}, "sft"),
        rl=from_config(RLConfig, {**c["rl"], "seed": seed, "chat_format": chat_format, "mesh": c["mesh"],
                                  **model.compute()}, "rl"),
        eval=from_config(EvalConfig, c["eval"], "eval"),
        env=from_config(EnvConfig, c["env"], "env"))
    return common, c, examples


def swe_config(config: ConfigDict) -> SWEConfig:
    """The stage configs of a ``configs/swe_bar.py`` config (:func:`shared_stages`, and the SWE stages')."""
    common, c, examples = shared_stages(config)
    return SWEConfig(
        **common,
        tasks=from_config(TaskSetConfig, c["tasks"], "tasks"),
        teacher=from_config(CollectionConfig, c["teacher"], "teacher"),
        examples=from_config(ExamplesConfig, {**examples, "seed": common["seed"], "chat_format": common["chat_format"]},
                             "sft.examples"))


@dataclass
class RecipeResult:
    held_out: dict[str, dict[str, dict[str, float]]]  # "init", "sft", "rl" -> "greedy", "sampled" -> metrics
    rl_change: dict[str, float]  # paired_change() from the policy RL starts from to the one it ends with
    rl_metrics: dict[int, dict[str, float]]  # per RL step
    tasks: dict[str, int]  # "sft", "rl", "held_out", "held_out_helpers" -> how many instances
    teacher: dict[str, float]
    seconds: dict[str, float]  # per stage, spent in this invocation (a reused stage takes ~0 s)
    held_out_helpers: dict[str, dict[str, dict[str, float]]] = field(default_factory=dict)  # as held_out
    rl_change_helpers: dict[str, float] = field(default_factory=dict)  # as rl_change, over held_out_helpers

    def to_dict(self) -> dict[str, Any]:
        return {"held_out": self.held_out, "held_out_helpers": self.held_out_helpers, "rl_change": self.rl_change,
                "rl_change_helpers": self.rl_change_helpers,
                "rl_metrics": {str(k): v for k, v in self.rl_metrics.items()}, "tasks": self.tasks,
                "teacher": self.teacher, "seconds": self.seconds}


class Clock:
    """Seconds spent per stage, summed over the calls."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}
        self.last = time.perf_counter()

    def lap(self, stage: str) -> None:
        now = time.perf_counter()
        self.seconds[stage] = self.seconds.get(stage, 0.0) + now - self.last
        self.last = now


def _ids(instances: Sequence[SWEInstance]) -> str:
    """The fingerprint of which instances a stage sees."""
    return fingerprint(sorted(i.instance_id for i in instances))


def tasks_stage(config: SWEConfig, workdir: str, rerun: bool) -> tuple[TaskSplit, str]:
    """Stage 1: the instances (a file, or generated once into ``tasks/``) and their split; returns
    the split and the fingerprint of the instances, which later stages take as an input."""
    if config.tasks.path:
        instances = make_task_set(config.tasks, "", config.seed)
        made_by = file_fingerprint(config.tasks.path)
    else:
        generation = {"seed": config.seed, **{name: getattr(config.tasks, name) for name in GENERATION_FIELDS}}
        stage = Stage(os.path.join(workdir, "tasks"), "tasks", generation)
        if stage.open(rerun) == "done":
            instances = load_instances(os.path.join(stage.directory, "instances.jsonl"))
        else:
            instances = make_task_set(config.tasks, stage.directory, config.seed)
            stage.finish({"instances": len(instances)})
        made_by = stage.fingerprint
    return split_task_set(instances, config.tasks, config.seed), made_by


async def teacher_stage(config: SWEConfig, workdir: str, client: AsyncSandboxClient, setups: SetupCache,
                        split: TaskSplit, inputs: dict[str, str], rerun: bool,
                        harnesses: Sequence[Harness] = (BashHarness(),)) -> tuple[list[Trajectory], str]:
    """Stage 2: ``teacher.samples`` graded teacher episodes of every SFT task in each harness."""
    names = [h.name for h in harnesses]
    stage = Stage(os.path.join(workdir, "teacher"), "teacher", config.teacher,
                  {**inputs, "instances": _ids(split.sft), **({"harnesses": ",".join(names)} if names != ["bash"] else {})})
    path = os.path.join(stage.directory, "trajectories.jsonl")
    if stage.open(rerun) == "done":
        return list(read_trajectories(path)), stage.fingerprint
    teacher = config.teacher
    report = await collect(client, swe_tasks(split.sft), list(harnesses), teacher.teacher(), teacher.samples,
                           limits=Limits(max_steps=teacher.max_turns), concurrency=teacher.concurrency,
                           seed=config.seed, setups=setups)
    if report.errors:
        log.warning("%d teacher episodes failed: %s", len(report.errors), report.errors[:3])
    save_trajectories(path, report.kept)
    log.info("teacher: %s", report.summary())
    stage.finish(report.summary())
    return report.kept, stage.fingerprint


def message_texts(trajectories: Sequence[Trajectory]) -> list[str]:
    """The text of the teacher's trajectories a BPE learns from: each message's content, reasoning and
    tool calls (as JSON), in order."""
    texts = []
    for trajectory in trajectories:
        for message in trajectory.messages:
            texts += [message.content or "", message.reasoning or ""]
            texts += [json.dumps({"name": c.name, "arguments": c.arguments}) for c in message.tool_calls]
    return texts


def tokenizer_stage(config: Any, workdir: str, trajectories: Sequence[Trajectory], teacher: str,
                    rerun: bool, texts: Callable[[Sequence[Trajectory]], list[str]] | None = None,
                    special_tokens: Sequence[str] | None = None) -> tuple[Tokenizer, str, str]:
    """Stage 3: the tokenizer ``config.tokenizer.path`` names, or a BPE of ``config.tokenizer.train_vocab``
    tokens trained on ``texts(trajectories)`` (default: the messages' contents) with ``special_tokens``
    (default: :meth:`Tokenizer.train`'s); returns it, where it lives and its fingerprint."""
    if config.tokenizer.path:
        path = resolve(config.tokenizer.path)
        return Tokenizer.from_pretrained(path), path, fingerprint({"tokenizer": config.tokenizer.path})
    stage = Stage(os.path.join(workdir, "tokenizer"), "tokenizer", config.tokenizer, {"teacher": teacher})
    if stage.open(rerun) != "done":
        corpus = (texts(trajectories) if texts is not None
                  else [m.content for t in trajectories for m in t.messages if m.content])
        if not any(corpus):
            raise ValueError("no teacher text to train a tokenizer on: set tokenizer.path or collect trajectories")
        extra = {"special_tokens": special_tokens} if special_tokens is not None else {}
        Tokenizer.train(corpus, config.tokenizer.train_vocab, **extra).save_pretrained(stage.directory)
        stage.finish()
    return Tokenizer.from_pretrained(stage.directory), stage.directory, stage.fingerprint


def trained_policy(config: SharedStages, directory: str, mesh: Mesh | None = None) -> Transformer:
    """The policy a stage trained into ``directory``, as the config's stages compute with it: the config's
    model settings (dtypes, attention block, rematerialisation, logits chunk) with that path; on ``mesh``,
    placed as RL places its own (so the two share their compiled programs)."""
    return build_model(replace(config.model, path=directory), config.seed, mesh=mesh)


def sft_stage(config: SWEConfig, workdir: str, trajectories: Sequence[Trajectory], tokenizer: Tokenizer,
              tokenizer_dir: str, inputs: dict[str, str], rerun: bool,
              group: Callable[[Trajectory], str] | None = None) -> tuple[str, str]:
    """Stage 4: credit-assignment SFT; returns the trained policy's directory (with its tokenizer)
    and its fingerprint. ``group``: a trajectory's group, for the ``diverse`` selection rule."""
    data = Stage(os.path.join(workdir, "sft_data"), "sft_data", config.examples, inputs)
    if data.open(rerun) != "done":
        build_examples(config.examples, data.directory, tokenizer, trajectories, group)
        data.finish(read_json(os.path.join(data.directory, "stats.json"))["train"])
    directory = os.path.join(workdir, "sft")
    train_and_evaluate(config.sft, directory, examples=os.path.join(data.directory, "train.jsonl"),
                       eval_examples=os.path.join(data.directory, "eval.jsonl"), vocab_size=tokenizer.vocab_size,
                       inputs={"examples": data.fingerprint}, rerun=rerun)
    model_dir = os.path.join(directory, "model")
    if not os.path.exists(os.path.join(model_dir, "tokenizer.json")):
        Tokenizer.from_pretrained(tokenizer_dir).save_pretrained(model_dir)
    return model_dir, made_by(directory)


async def evaluation_stage(config: SWEConfig, workdir: str, client: AsyncSandboxClient, setups: SetupCache,
                           name: str, pass_: str, model: Transformer, tokenizer: Tokenizer, split: TaskSplit,
                           inputs: dict[str, str], rerun: bool, held_out: str = "held_out",
                           harness: Harness | ExternalHarness | None = None,
                           external: Callable[[float], AbstractAsyncContextManager[Any]] | None = None
                           ) -> dict[str, float]:
    """Stage 5: the resolve rate of ``model`` over one held-out set of ``split`` (``held_out`` or
    ``held_out_helpers``, see :data:`HELD_OUT`), greedy (one episode a task at T = 0) or sampled
    (``eval.samples`` a task at the rollouts' temperature); the episodes are kept in the stage
    folder. For ``held_out``, ``unseen_test_*`` are the same over the tasks :func:`unseen_tests` names.

    The episodes run in ``harness`` (default: the bash harness) with the in-process engine, or, for
    an :class:`~orchard.harness.adapters.external.ExternalHarness`, in the runner ``external`` opens
    for a temperature (its model served for the occasion: :mod:`orchard.recipes.cross_harness`)."""
    samples, temperature = (1, 0.0) if pass_ == "greedy" else (config.eval.samples, config.rl.rollout.temperature)
    harness = harness or BashHarness()
    settings = {"pass": pass_, "samples": samples, "temperature": temperature, "rollout": config.rl.rollout,
                "chat_format": config.chat_format, "seed": config.seed,
                **({"harness": harness.name} if harness.name != "bash" else {})}
    instances: list[SWEInstance] = getattr(split, held_out)
    stage = Stage(os.path.join(workdir, "eval", f"{name}_{pass_}{HELD_OUT[held_out]}"), "eval", settings,
                  {**inputs, "instances": _ids(instances)})
    result_path = os.path.join(stage.directory, "result.json")
    if stage.open(rerun) == "done":
        return read_json(result_path)
    label = f"eval {name} {pass_}{HELD_OUT[held_out].replace('_', ' ')}"
    if external is not None:
        async with external(temperature) as runner:
            evaluation = await evaluate_policy(runner, swe_tasks(instances), samples, seed=config.seed, name=label)
    else:
        chat_format = make_chat_format(config.chat_format, tokenizer)
        policy = make_policy(config.rl, JaxEngine(model, tokenizer), chat_format, temperature=temperature)
        runner = config.rl.rollout.runner(client, harness, policy, setups)
        evaluation = await evaluate_policy(runner, swe_tasks(instances), samples, seed=config.seed, name=label)
    result = evaluation.metrics()
    if held_out == "held_out":
        apart = [t.outcome.resolved for t in evaluation.trajectories if t.task_id in split.unseen]
        result["unseen_test_episodes"] = float(len(apart))
        result["unseen_test_resolve_rate"] = sum(apart) / len(apart) if apart else 0.0
    save_trajectories(episodes_path(stage.directory), evaluation.trajectories)
    write_json(result_path, result)
    stage.finish()
    return result


def episodes_path(directory: str) -> str:
    """Where an evaluation stage keeps the graded episodes behind its result."""
    return os.path.join(directory, "trajectories.jsonl")


def sampled_change(before: str, after: str) -> dict[str, float]:
    """The paired per-task change of the sampled held-out rate between the episodes in two evaluation
    folders, and its one-sided sign test."""
    start, end = (Evaluation.of(list(read_trajectories(episodes_path(d)))).task_rates() for d in (before, after))
    return paired_change(start, end).to_dict()


async def run_recipe(config: ConfigDict, workdir: str, *, rerun: bool = False) -> RecipeResult:
    """The five stages of Orchard-SWE over ``workdir``; see the module docstring."""
    settings = swe_config(config)  # every stage's config checked before anything runs
    os.makedirs(workdir, exist_ok=True)
    write_json(os.path.join(workdir, "config.json"), config)
    clock = Clock()
    split, tasks_made_by = tasks_stage(settings, workdir, rerun)
    clock.lap("tasks")
    held: dict[str, dict[str, dict[str, dict[str, float]]]] = {name: {} for name in HELD_OUT}  # set, stage, pass
    held_sets = [name for name in HELD_OUT if getattr(split, name)]  # the held-out sets that have instances
    rl_start = "sft" if settings.sft.num_steps else "init"
    with orchestrator(settings.env.url, settings.env.api_key) as endpoint:
        client = endpoint.async_client()
        setups = SetupCache(client)  # every episode of a task forks one set-up of it
        try:
            trajectories: list[Trajectory] = []
            teacher_made_by = ""
            if settings.teacher.samples:
                trajectories, teacher_made_by = await teacher_stage(settings, workdir, client, setups, split,
                                                                    {"tasks": tasks_made_by}, rerun)
            clock.lap("collect")
            tokenizer, tokenizer_dir, tokenizer_made_by = tokenizer_stage(settings, workdir, trajectories,
                                                                          teacher_made_by, rerun)

            async def evaluate(name: str, model: Transformer, made_by: str, passes: Sequence[str]) -> None:
                for held_out in held_sets:
                    held[held_out][name] = {
                        pass_: await evaluation_stage(settings, workdir, client, setups, name, pass_, model, tokenizer,
                                                      split, {"policy": made_by, "tasks": tasks_made_by}, rerun,
                                                      held_out)
                        for pass_ in passes}

            mesh = settings.mesh.make()

            def policy_model(directory: str) -> Transformer:
                return trained_policy(settings, directory, mesh)

            if held_sets:
                initial = build_model(settings.model, settings.seed, tokenizer.vocab_size, mesh)
                init_made_by = fingerprint({"model": settings.model, "tokenizer": tokenizer_made_by,
                                            "seed": settings.seed})
                await evaluate("init", initial, init_made_by, PASSES if rl_start == "init" else ["greedy"])
            clock.lap("evaluate")
            policy_dir, policy_made_by = resolve(settings.model.path), fingerprint({"model": settings.model.path})
            if settings.sft.num_steps:
                policy_dir, policy_made_by = sft_stage(settings, workdir, trajectories, tokenizer, tokenizer_dir,
                                                       {"teacher": teacher_made_by, "tokenizer": tokenizer_made_by},
                                                       rerun)
                clock.lap("sft")
                if held_sets:
                    await evaluate("sft", policy_model(policy_dir), policy_made_by, PASSES)
                clock.lap("evaluate")
            rl_dir = os.path.join(workdir, "rl")
            await train_rl(settings.rl, rl_dir, client, swe_tasks(split.rl_prompts), BashHarness(), policy=policy_dir,
                           tokenizer=tokenizer_dir, inputs={"policy": policy_made_by, "tasks": tasks_made_by,
                                                            "instances": _ids(split.rl_prompts)}, rerun=rerun,
                           setups=setups)
            clock.lap("rl")
            if held_sets:
                await evaluate("rl", policy_model(os.path.join(rl_dir, "model")), made_by(rl_dir), PASSES)
            clock.lap("evaluate")
        finally:
            await setups.close()
            await client.aclose()
    rl_change = {held_out: sampled_change(os.path.join(workdir, "eval", f"{rl_start}_sampled{suffix}"),
                                          os.path.join(workdir, "eval", f"rl_sampled{suffix}"))
                 for held_out, suffix in HELD_OUT.items() if held_out in held_sets}
    result = RecipeResult(held_out=held["held_out"], rl_change=rl_change.get("held_out", {}),
                          rl_metrics=read_metrics(rl_dir),
                          tasks={"sft": len(split.sft), "rl": len(split.rl), "held_out": len(split.held_out),
                                 "held_out_helpers": len(split.held_out_helpers)},
                          teacher={"trajectories": len(trajectories),
                                   "resolved": sum(t.outcome.resolved for t in trajectories)},
                          seconds=clock.seconds, held_out_helpers=held["held_out_helpers"],
                          rl_change_helpers=rl_change.get("held_out_helpers", {}))
    write_json(os.path.join(workdir, "summary.json"), result.to_dict())
    return result


def run(config: ConfigDict, workdir: str, *, rerun: bool = False) -> RecipeResult:
    """:func:`run_recipe` from synchronous code."""
    return asyncio.run(run_recipe(config, workdir, rerun=rerun))
