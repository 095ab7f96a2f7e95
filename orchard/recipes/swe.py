"""Orchard-SWE in one call: tasks, teacher trajectories, credit-assignment SFT, BAR RL, held-out eval.

:func:`run_recipe` chains the library's stages over one workdir::

    tasks/            instances.jsonl, repos/      (orchard.tasks.swe.generate)
    teacher/          trajectories.jsonl           (orchard.tasks.swe.collect, graded in sandboxes)
    tokenizer/        a BPE trained on the teacher text, unless the config names one
    sft/              examples, checkpoints, metrics (orchard.train.sft)
    sft_model/        the SFT policy as an HF directory
    rl/               checkpoints, metrics          (orchard.train.rl)
    rl_model/         the RL policy as an HF directory
    eval/             <stage>_<pass>.json: held-out resolve rates (stage init, sft or rl; pass
                      greedy or sampled), and the episodes behind each
                      (sft_sampled.trajectories.jsonl, ...)
    summary.json

Each stage is skipped when its output exists, and SFT and RL resume from their checkpoints, so a
killed run continues where it stopped. The held-out split is by task instance
(:func:`split_tasks`): no held-out bug is seen in collection, SFT or RL, but another bug of the
same function may be; the held-out instances whose failing test no training instance has (for
``opkit``: helpers never seen broken) are also reported apart. Every stage's policy is evaluated
greedily, one episode a task, as resolve rates are usually reported; the policies RL starts from
and ends with are also evaluated sampled, ``eval.samples`` episodes a task at ``rl.temperature``
(avg@k): that is the rate RL's reward optimises, and the paired per-task change between the two
is summarised by :func:`sampled_change`.
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
(``sft.data.observation_weight``, :mod:`orchard.data.examples`). The default runs RL without the
pass-rate filter: its rollouts (4 of each of the 34 prompts) would cost a minute of the budget,
and BAR's strides already spend more rollouts on prompts whose groups have no variance.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import json
import logging
import math
import os
import random
import time
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from typing import Any

from ml_collections import ConfigDict

from orchard.data.chat import Qwen3Format
from orchard.data.tokenizer import Tokenizer
from orchard.data.trajectory import Trajectory, read_trajectories, save_trajectories
from orchard.env import AsyncSandboxClient, local_server
from orchard.harness.bash import BashHarness
from orchard.harness.core import Limits
from orchard.harness.policies import EnginePolicy, OpenAIChatPolicy
from orchard.models import from_pretrained
from orchard.models.shipped import resolve
from orchard.rollout.jax_engine import JaxEngine
from orchard.rollout.sampler import SamplingParams
from orchard.tasks.swe.collect import collect
from orchard.tasks.swe.generate import generate_task_set
from orchard.tasks.swe.instance import SWEInstance, load_instances
from orchard.tasks.swe.oracle import OracleTeacher
from orchard.tasks.swe.sft_data import build_sft_data
from orchard.tasks.swe.sources import resolve_source
from orchard.train.metrics import read_metrics
from orchard.train.rl import RolloutWorkers, evaluate, train_rl
from orchard.train.sft import build_model, train_and_evaluate

log = logging.getLogger(__name__)


def split_tasks(instances: Sequence[SWEInstance], held_out_fraction: float, seed: int
                ) -> tuple[list[SWEInstance], list[SWEInstance]]:
    """(train, held out): a seeded ``held_out_fraction`` of the task instances is held out.

    A held-out instance (its bug, its problem statement, its failing-test report) is never seen in
    teacher collection, SFT or RL. Another bug of the same function may be: the split is by
    instance, not by the test that catches it, so most held-out bugs are in functions whose correct
    code the policy was trained to restore after a different break. :func:`unseen_tests` names the
    held-out instances whose failing test no training instance has, and the evaluation reports
    them apart (for ``opkit``: helpers never seen broken in training)."""
    ids = sorted(i.instance_id for i in instances)
    random.Random(seed).shuffle(ids)
    held = set(ids[: math.ceil(len(ids) * held_out_fraction)])
    return [i for i in instances if i.instance_id not in held], [i for i in instances if i.instance_id in held]


def _test_key(instance: SWEInstance) -> str:
    return instance.FAIL_TO_PASS[0] if instance.FAIL_TO_PASS else instance.instance_id


def unseen_tests(train: Sequence[SWEInstance], held_out: Sequence[SWEInstance]) -> set[str]:
    """Ids of the held-out instances whose first failing test catches no training instance."""
    seen = {_test_key(i) for i in train}
    return {i.instance_id for i in held_out if _test_key(i) not in seen}


def _csv(value: str) -> list[str]:
    return [part.strip() for part in value.split(",") if part.strip()]


def load_or_generate_tasks(config: ConfigDict, workdir: str) -> list[SWEInstance]:
    """Stage 1: ``tasks.path`` if given, else synthetic bugs in ``tasks.sources`` (cached in the workdir)."""
    if config.tasks.path:
        return load_instances(config.tasks.path)
    out = os.path.join(workdir, "tasks")
    if os.path.exists(os.path.join(out, "instances.jsonl")):
        return load_instances(os.path.join(out, "instances.jsonl"))
    instances, report = generate_task_set([resolve_source(name) for name in _csv(config.tasks.sources)],
                                          config.tasks.count, out, seed=config.seed,
                                          kinds=tuple(_csv(config.tasks.kinds)),
                                          tests_visible=config.tasks.tests_visible)
    log.info("generated %d tasks in %.0f s (%s)", len(instances), report.seconds, report.to_dict()["by_kind"])
    return instances


def _teacher(config: ConfigDict) -> Callable[[SWEInstance, str, int], Any]:
    if config.url:
        policy = OpenAIChatPolicy(config.url, config.model)
        return lambda instance, harness, k: policy
    variants = _csv(config.variants)
    return lambda instance, harness, k: OracleTeacher(instance, harness, variants[k % len(variants)], seed=k,
                                                      brief=config.brief)


async def collect_teacher(config: ConfigDict, client: AsyncSandboxClient, instances: Sequence[SWEInstance],
                          path: str) -> list[Trajectory]:
    """Stage 2: ``teacher.samples`` graded teacher episodes per training task, written to ``path``."""
    if os.path.exists(path):
        return list(read_trajectories(path))
    report = await collect(client, instances, [BashHarness()], _teacher(config.teacher), config.teacher.samples,
                           limits=Limits(max_steps=config.teacher.max_turns), concurrency=config.teacher.concurrency)
    if report.errors:
        log.warning("%d teacher episodes failed: %s", len(report.errors), report.errors[:3])
    save_trajectories(path, report.kept)
    log.info("teacher: %s", report.summary())
    return report.kept


def prepare_tokenizer(config: ConfigDict, trajectories: Sequence[Trajectory], directory: str) -> str:
    """The tokenizer directory: ``tokenizer.path``, or a BPE trained on the teacher text."""
    if config.tokenizer.path:
        return resolve(config.tokenizer.path)
    if not os.path.exists(os.path.join(directory, "tokenizer.json")):
        texts = [m.content for t in trajectories for m in t.messages if m.content]
        if not texts:
            raise ValueError("no teacher text to train a tokenizer on: set tokenizer.path or collect trajectories")
        Tokenizer.train(texts, config.tokenizer.train_vocab).save_pretrained(directory)
    return directory


def _with_model(config: ConfigDict, tokenizer_dir: str) -> ConfigDict:
    """``config.model`` with the vocabulary size of a fresh model set from the tokenizer."""
    model = copy.deepcopy(config.model)
    if not model.path:
        model.init.vocab_size = Tokenizer.from_pretrained(tokenizer_dir).vocab_size
    return model


def run_sft(config: ConfigDict, workdir: str, trajectories: str, tokenizer_dir: str) -> str:
    """Stage 3: credit-assignment SFT; returns the exported model directory (with its tokenizer)."""
    export = os.path.join(workdir, "sft_model")
    if os.path.exists(os.path.join(export, "tokenizer.json")):
        return export
    sft = copy.deepcopy(config.sft)
    sft.unlock()  # the stage adds its own fields
    sft.seed, sft.mesh, sft.model = config.seed, config.mesh, _with_model(config, tokenizer_dir)
    sft.data.update({"trajectories": trajectories, "tokenizer": tokenizer_dir, "synthetic_tasks": 0})
    directory = os.path.join(workdir, "sft")
    sft.data.train, sft.data.eval = build_sft_data(sft, directory)
    train_and_evaluate(sft, directory, export_dir=export)
    Tokenizer.from_pretrained(tokenizer_dir).save_pretrained(export)
    return export


async def run_rl(config: ConfigDict, workdir: str, client: AsyncSandboxClient, instances: Sequence[SWEInstance],
                 model_dir: str) -> str:
    """Stage 4: BAR RL from ``model_dir``; returns the exported policy directory."""
    export = os.path.join(workdir, "rl_model")
    if os.path.exists(os.path.join(export, "tokenizer.json")):
        return export
    rl = copy.deepcopy(config)
    rl.model.path, rl.tokenizer.path = model_dir, model_dir
    await train_rl(rl, os.path.join(workdir, "rl"), client, instances, BashHarness(), export_dir=export)
    Tokenizer.from_pretrained(model_dir).save_pretrained(export)
    return export


async def evaluate_policy(config: ConfigDict, client: AsyncSandboxClient, model: Any, tokenizer: Tokenizer,
                          instances: Sequence[SWEInstance], path: str, unseen: frozenset[str] = frozenset(),
                          samples: int = 1, temperature: float = 0.0) -> dict[str, float]:
    """Stage 5: the held-out resolve rate of ``model`` over ``samples`` episodes per task at
    ``temperature`` (0 is greedy), cached in ``path``; the graded episodes go beside it, in
    ``<name>.trajectories.jsonl``, to be read. ``unseen_test_episodes`` and
    ``unseen_test_resolve_rate`` are the same over the tasks in ``unseen`` (:func:`unseen_tests`)."""
    if os.path.exists(path):
        with open(path) as handle:
            return json.load(handle)
    rl = config.rl
    policy = EnginePolicy(JaxEngine(model, tokenizer), Qwen3Format(tokenizer),
                          SamplingParams(max_tokens=rl.max_new_tokens, temperature=temperature, seed=config.seed))
    workers = RolloutWorkers(client, BashHarness(), policy,
                             Limits(max_steps=rl.max_turns, max_tokens=rl.max_context, time_limit=rl.episode_seconds),
                             rl.concurrency)
    result, episodes = await evaluate(workers, instances, samples=samples, seed=config.seed + 1)
    apart = [t.outcome.resolved for t in episodes if t.task_id in unseen]
    result["unseen_test_episodes"] = float(len(apart))
    result["unseen_test_resolve_rate"] = sum(apart) / len(apart) if apart else 0.0
    os.makedirs(os.path.dirname(path), exist_ok=True)
    save_trajectories(episodes_path(path), episodes)
    with open(path, "w") as handle:
        json.dump(result, handle, indent=2)
    return result


def episodes_path(result_path: str) -> str:
    """Where :func:`evaluate_policy` keeps the graded episodes behind ``result_path``."""
    return os.path.splitext(result_path)[0] + ".trajectories.jsonl"


def task_rates(episodes: str) -> dict[str, float]:
    """Each task's resolve rate over the graded episodes in the file ``episodes``."""
    outcomes: dict[str, list[bool]] = {}
    for trajectory in read_trajectories(episodes):
        outcomes.setdefault(trajectory.task_id, []).append(trajectory.outcome.resolved)
    return {task: sum(solved) / len(solved) for task, solved in outcomes.items()}


def sampled_change(before: str, after: str) -> dict[str, float]:
    """The paired per-task change of the sampled held-out rate from the episodes in ``before`` to
    those in ``after``: how many tasks rose and fell, and the one-sided sign test's p-value of at
    least that many rising if RL changed nothing (each changed task equally likely to go either way)."""
    start, end = task_rates(before), task_rates(after)
    up = sum(end[task] > rate for task, rate in start.items())
    down = sum(end[task] < rate for task, rate in start.items())
    changed = up + down
    p_value = sum(math.comb(changed, k) for k in range(up, changed + 1)) / 2 ** changed
    return {"tasks_up": float(up), "tasks_down": float(down), "sign_test_p": p_value}


@contextlib.asynccontextmanager
async def sandbox_client(config: ConfigDict) -> AsyncIterator[AsyncSandboxClient]:
    """A client of ``env.url``, or of a local orchestrator started for the run."""
    with contextlib.ExitStack() as stack:
        if config.env.url:
            url, key = config.env.url, config.env.api_key or os.environ.get("ORCHARD_API_KEY", "")
        else:
            server = stack.enter_context(local_server())
            url, key = server.base_url, server.api_key
        client = AsyncSandboxClient(url, api_key=key)
        try:
            yield client
        finally:
            await client.aclose()


@dataclass
class RecipeResult:
    held_out: dict[str, dict[str, dict[str, float]]]  # "init", "sft", "rl" -> "greedy", "sampled" -> evaluate()'s
    rl_change: dict[str, float]  # sampled_change() from the policy RL starts from to the one it ends with
    rl_metrics: dict[int, dict[str, float]]  # per RL step
    tasks: dict[str, int]  # "sft", "rl", "held_out" -> how many instances
    teacher: dict[str, float]
    seconds: dict[str, float]  # per stage

    def to_dict(self) -> dict[str, Any]:
        return {"held_out": self.held_out, "rl_change": self.rl_change,
                "rl_metrics": {str(k): v for k, v in self.rl_metrics.items()}, "tasks": self.tasks,
                "teacher": self.teacher, "seconds": self.seconds}


async def run_recipe(config: ConfigDict, workdir: str) -> RecipeResult:
    """The five stages of Orchard-SWE over ``workdir``; see the module docstring."""
    os.makedirs(workdir, exist_ok=True)
    seconds: dict[str, float] = {}
    clock = time.perf_counter()

    def lap(stage: str) -> None:
        nonlocal clock
        now = time.perf_counter()
        seconds[stage] = seconds.get(stage, 0.0) + now - clock
        clock = now

    instances = load_or_generate_tasks(config, workdir)
    train, held_out = split_tasks(instances, config.tasks.held_out_fraction, config.seed)
    unseen = frozenset(unseen_tests(train, held_out))
    sft_tasks, rl_tasks = split_tasks(train, config.tasks.rl_fraction, config.seed + 1)
    if not sft_tasks or (config.tasks.rl_fraction and not rl_tasks):
        raise ValueError(f"{len(train)} training tasks do not split into SFT and RL tasks: add tasks or lower "
                         "tasks.held_out_fraction and tasks.rl_fraction")
    lap("tasks")
    held: dict[str, dict[str, dict[str, float]]] = {}
    evaluations = os.path.join(workdir, "eval")
    passes = {"greedy": (1, 0.0), "sampled": (config.eval.samples, config.rl.temperature)}
    rl_start = "sft" if config.sft.num_steps else "init"
    async with sandbox_client(config) as client:
        trajectories: list[Trajectory] = []
        if config.teacher.samples:
            trajectories = await collect_teacher(config, client, sft_tasks, os.path.join(workdir, "teacher",
                                                                                          "trajectories.jsonl"))
        lap("collect")
        tokenizer_dir = prepare_tokenizer(config, trajectories, os.path.join(workdir, "tokenizer"))
        tokenizer = Tokenizer.from_pretrained(tokenizer_dir)

        async def evaluate_stage(stage: str, model: Any, names: Sequence[str]) -> None:
            held[stage] = {name: await evaluate_policy(config, client, model, tokenizer, held_out,
                                                       os.path.join(evaluations, f"{stage}_{name}.json"), unseen,
                                                       *passes[name]) for name in names}

        if held_out:
            initial = build_model(_with_model(config, tokenizer_dir), config.seed)
            await evaluate_stage("init", initial, list(passes) if rl_start == "init" else ["greedy"])
        lap("evaluate")
        model_dir = config.model.path
        if config.sft.num_steps:
            model_dir = run_sft(config, workdir, os.path.join(workdir, "teacher", "trajectories.jsonl"),
                                tokenizer_dir)
            lap("sft")
            if held_out:
                await evaluate_stage("sft", from_pretrained(model_dir), passes)
            lap("evaluate")
        rl_dir = await run_rl(config, workdir, client, rl_tasks or sft_tasks, resolve(model_dir))
        lap("rl")
        if held_out:
            await evaluate_stage("rl", from_pretrained(rl_dir), passes)
        lap("evaluate")
    rl_change = {}
    if held_out:
        rl_change = sampled_change(episodes_path(os.path.join(evaluations, f"{rl_start}_sampled.json")),
                                   episodes_path(os.path.join(evaluations, "rl_sampled.json")))
    resolved = sum(t.outcome.resolved for t in trajectories)
    result = RecipeResult(held_out=held, rl_change=rl_change, rl_metrics=read_metrics(os.path.join(workdir, "rl")),
                          tasks={"sft": len(sft_tasks), "rl": len(rl_tasks), "held_out": len(held_out)},
                          teacher={"trajectories": len(trajectories), "resolved": resolved}, seconds=seconds)
    with open(os.path.join(workdir, "summary.json"), "w") as handle:
        json.dump(result.to_dict(), handle, indent=2)
    return result


def run(config: ConfigDict, workdir: str) -> RecipeResult:
    """:func:`run_recipe` from synchronous code."""
    return asyncio.run(run_recipe(config, workdir))
