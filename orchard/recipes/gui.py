"""Orchard-GUI in one call: MiniWoB++ tasks, teacher trajectories through the real browser, per-turn
SFT of a vision-language policy, multi-turn GRPO with the paper's reward, and held-out evaluation.

:func:`run_recipe` chains the stages over one workdir; each is a :class:`~orchard.workdir.Stage`::

    config.json        the whole resolved config of the last run
    images/            every screenshot of every episode, by content hash (orchard.data.images)
    tasks/             instances.jsonl: (page, seed, instruction) of each split
    teacher/           trajectories.jsonl: the oracle's shortest success per instance, a cap per page
    tokenizer/         a BPE trained on the teacher text, with the vision special tokens
    sft_data/          train.jsonl, eval.jsonl, images.json (one example per assistant turn)
    sft/               checkpoints, metrics, model/
    rl/                checkpoints, metrics, curriculum.json, model/
    eval/<stage>_<pass>_<set>/  result.json and the episodes behind it: stage init, sft or rl; pass
                       greedy or sampled; set held_out_seed or held_out_task
    summary.json

Splits (:func:`~orchard.tasks.gui.collect.gui_splits`): a seeded fraction of the pages is held out
whole (``held_out_task``: never seen in collection, SFT or RL); the other pages' training seeds are
split into SFT seeds (the teacher's) and RL seeds (RL's prompts), and their held-out seeds come from a
range training never draws from (``held_out_seed``: new instructions and layouts of familiar pages).
No setting of the default was chosen on a held-out set.

The stages follow the paper (section 3.4 of the notes): SFT trains every assistant turn as its own
sample, on that turn only, under the view the policy samples with (the latest ``k`` screenshots);
GRPO trains per-turn rows exactly as sampled, with the trajectory's group-relative advantage on every
turn, asymmetric clipping, no KL, and the step-budget curriculum; rewards are
:func:`~orchard.tasks.gui.judges.gui_reward` over the rule judge (the page's own raw reward).

Departures, at the embedded default's scale: the teacher is the oracle (:mod:`orchard.tasks.gui.oracle`),
not a 235B model; the policy is a tiny Qwen3-VL trained from scratch over a BPE of the teacher text;
the pages are a handful of MiniWoB++ pages, not the open web. The policy sees pixels only, as the
paper's; ``harness.elements`` adds the page's element list beside the screenshot
(``configs/gui_grpo.py:elements``). docs/benchmarks.md reports both: at this scale neither learns
more than the other.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from ml_collections import ConfigDict
from tqdm.auto import tqdm

from orchard.config import fingerprint, from_config
from orchard.data.chat import ChatFormat
from orchard.data.examples import latest_images, turn_examples
from orchard.data.images import ImageStore
from orchard.data.tokenizer import Tokenizer
from orchard.data.trajectory import Trajectory, read_trajectories, save_trajectories
from orchard.data.vision_rows import ImageTable
from orchard.env import AsyncSandboxClient, orchestrator
from orchard.eval.runner import Evaluation, evaluate_policy
from orchard.harness.browser import SYSTEM_PROMPT, TOOLS, BrowserHarness
from orchard.harness.chromium import BrowserSettings
from orchard.harness.core import Limits
from orchard.harness.episode import EpisodeRunner, SandboxPool
from orchard.models.build import build_model
from orchard.models.shipped import resolve
from orchard.models.transformer import Transformer
from orchard.models.weights import save_pretrained
from orchard.recipes.swe import (
    Clock,
    SharedStages,
    episodes_path,
    message_texts,
    sampled_change,
    shared_stages,
    trained_policy,
)
from orchard.recipes.swe import tokenizer_stage as shared_tokenizer_stage
from orchard.rollout.jax_engine import JaxEngine, model_chat_format
from orchard.tasks.gui.collect import collect, gui_splits, loop_seconds
from orchard.tasks.gui.miniwob import CATALOGUE, FAMILY, MiniWoBTask, build_instances
from orchard.train.metrics import read_metrics
from orchard.train.rl import make_policy, train_rl
from orchard.train.sft import train_and_evaluate
from orchard.workdir import Stage, made_by, read_json, write_json

log = logging.getLogger(__name__)
PASSES = ("greedy", "sampled")
HELD_OUT = ("held_out_seed", "held_out_task")
VISION_TOKENS = ("<|vision_start|>", "<|image_pad|>", "<|vision_end|>")
SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>", *VISION_TOKENS)


@dataclass(frozen=True)
class GUITasksConfig:
    """MiniWoB++ pages and how their instances split (see the module docstring)."""

    pages: tuple[str, ...] = ("click-test", "click-button", "click-link")
    sft_seeds: int = 6  # training seeds 0.. of each trained page: the teacher's
    rl_seeds: int = 4  # the next ones: RL's prompts
    held_out_seeds: int = 2  # of every page, from the held-out seed range
    held_out_page_fraction: float = 0.25  # pages held out whole
    viewport: tuple[int, int] = (160, 224)  # MiniWoB's 160 x 210 task area, rounded up to whole 32-pixel merges
    concurrency: int = 2  # sandboxes reading the instances' instructions


@dataclass(frozen=True)
class GUITeacherConfig:
    samples: int = 1  # oracle episodes per SFT instance (clean, wander, fail in turn)
    cap_per_site: int = 20  # the paper's K
    max_turns: int = 8
    concurrency: int = 2


@dataclass(frozen=True)
class GUIHarnessConfig:
    elements: bool = False  # the page's element list beside the screenshot (see the module docstring)
    pool: int = 4  # browsers kept between episodes (0: a sandbox per episode, the paper's setting)


@dataclass(frozen=True)
class GUIExamplesConfig:
    eval_fraction: float = 0.1  # of the teacher trajectories, for the SFT eval loss


@dataclass(frozen=True)
class GUIConfig(SharedStages):
    """The recipe's typed stage configs, checked when the recipe starts (:func:`gui_config`)."""

    tasks: GUITasksConfig
    teacher: GUITeacherConfig
    harness: GUIHarnessConfig
    examples: GUIExamplesConfig


def gui_config(config: ConfigDict) -> GUIConfig:
    """The stage configs of a ``configs/gui_grpo.py`` config (the shared ones, and the GUI stages')."""
    common, c, examples = shared_stages(config)
    return GUIConfig(
        **common,
        tasks=from_config(GUITasksConfig, c["tasks"], "tasks"),
        teacher=from_config(GUITeacherConfig, c["teacher"], "teacher"),
        harness=from_config(GUIHarnessConfig, c["harness"], "harness"),
        examples=from_config(GUIExamplesConfig, examples, "sft.examples"))


@dataclass
class GUITasks:
    sft: list[MiniWoBTask]
    rl: list[MiniWoBTask]
    held_out_seed: list[MiniWoBTask]
    held_out_task: list[MiniWoBTask]

    def counts(self) -> dict[str, int]:
        return {name: len(getattr(self, name)) for name in ("sft", "rl", *HELD_OUT)}


@dataclass
class GUIResult:
    held_out: dict[str, dict[str, dict[str, dict[str, float]]]]  # set -> stage -> pass -> metrics
    by_actions: dict[str, dict[str, dict[str, float]]]  # set -> stage -> "<n> actions" -> greedy success rate
    rl_change: dict[str, dict[str, float]]  # set -> paired_change() of the sampled rate, RL's start to its end
    rl_metrics: dict[int, dict[str, float]]
    tasks: dict[str, int]
    teacher: dict[str, Any]
    seconds: dict[str, float]
    variant: dict[str, Any] = field(default_factory=dict)  # what the policy sees
    browser_share: dict[str, float] = field(default_factory=dict)  # per stage: env_s / (env_s + policy_s)

    def to_dict(self) -> dict[str, Any]:
        return {"held_out": self.held_out, "by_actions": self.by_actions, "rl_change": self.rl_change,
                "rl_metrics": {str(k): v for k, v in self.rl_metrics.items()}, "tasks": self.tasks,
                "teacher": self.teacher, "seconds": self.seconds, "variant": self.variant,
                "browser_share": self.browser_share}


def browser_share(teacher: dict[str, Any], held: dict[str, dict[str, dict[str, dict[str, float]]]],
                  rl_metrics: dict[int, dict[str, float]]) -> dict[str, float]:
    """Per stage that runs episodes, the share of its agent loops' time spent in the environment (the
    browser's actions and observations) rather than in the policy."""
    def share(env: float, policy: float) -> float:
        return env / (env + policy) if env + policy else 0.0

    evals = [p for stages in held.values() for passes in stages.values() for p in passes.values()]
    return {"collect": share(teacher.get("env_s", 0.0), teacher.get("policy_s", 0.0)),
            "evaluate": share(sum(p.get("env_s", 0.0) for p in evals), sum(p.get("policy_s", 0.0) for p in evals)),
            "rl": share(sum(m.get("env_s", 0.0) for m in rl_metrics.values()),
                        sum(m.get("policy_s", 0.0) for m in rl_metrics.values()))}


def _settings(config: GUIConfig) -> BrowserSettings:
    return BrowserSettings(viewport=tuple(config.tasks.viewport))


def _record(task: MiniWoBTask) -> dict[str, Any]:
    return {"page": task.page, "seed": task.seed, "instruction": task.instruction, "threshold": task.threshold}


async def tasks_stage(config: GUIConfig, workdir: str, client: AsyncSandboxClient, rerun: bool) -> tuple[GUITasks, str]:
    """Stage 1: every instance of the split, with the instruction its page asks (read in browsers)."""
    tasks = config.tasks
    unknown = [page for page in tasks.pages if page not in CATALOGUE]
    if unknown:
        raise ValueError(f"pages {unknown} are not in the MiniWoB catalogue (orchard.tasks.gui.miniwob.CATALOGUE)")
    splits = gui_splits(tasks.pages, tasks.sft_seeds + tasks.rl_seeds, tasks.held_out_seeds,
                        tasks.held_out_page_fraction, config.seed)
    groups = {"sft": [(p, s) for p, s in splits.train if s < tasks.sft_seeds],
              "rl": [(p, s) for p, s in splits.train if s >= tasks.sft_seeds],
              "held_out_seed": splits.held_out_seed, "held_out_task": splits.held_out_task}
    stage = Stage(os.path.join(workdir, "tasks"), "tasks", tasks, {"seed": str(config.seed)})
    path = os.path.join(stage.directory, "instances.jsonl")
    settings = _settings(config)
    if stage.open(rerun) != "done":
        pairs = sorted({pair for group in groups.values() for pair in group})
        lanes = [pairs[i::tasks.concurrency] for i in range(tasks.concurrency)]
        bar = tqdm(total=len(pairs), desc="GUI tasks: reading instructions", unit="instance")

        async def read(lane: list[tuple[str, int]]) -> list[MiniWoBTask]:
            built = []
            async with await client.create(**FAMILY.sandbox) as box:
                for page, seed in lane:
                    built += await build_instances(box, [page], [seed], settings)
                    bar.update()
            return built

        with bar:
            built = [task for lane in await asyncio.gather(*(read(lane) for lane in lanes if lane)) for task in lane]
        with open(path, "w") as handle:
            for task in sorted(built, key=lambda t: (t.page, t.seed)):
                handle.write(json.dumps(_record(task)) + "\n")
        stage.finish({"instances": len(built)})
    with open(path) as handle:
        by_key = {(r["page"], r["seed"]): MiniWoBTask(r["page"], r["seed"], r["instruction"], r["threshold"], settings)
                  for r in map(json.loads, handle)}
    return GUITasks(**{name: [by_key[pair] for pair in pairs] for name, pairs in groups.items()}), stage.fingerprint


def harness(config: GUIConfig, images: ImageStore) -> BrowserHarness:
    return BrowserHarness(images=images, elements=config.harness.elements,
                          context_images=max(config.rl.context_images, 0))


async def teacher_stage(config: GUIConfig, workdir: str, client: AsyncSandboxClient, pool: SandboxPool | None,
                        images: ImageStore, tasks: GUITasks, tasks_made_by: str, rerun: bool
                        ) -> tuple[list[Trajectory], dict[str, Any], str]:
    """Stage 2: the oracle on every SFT instance; the shortest success per instance, at most K per page."""
    stage = Stage(os.path.join(workdir, "teacher"), "teacher", config.teacher,
                  {"tasks": tasks_made_by, "elements": str(config.harness.elements)})
    path = os.path.join(stage.directory, "trajectories.jsonl")
    if stage.open(rerun) == "done":
        return list(read_trajectories(path)), stage.summary(), stage.fingerprint
    teacher = config.teacher
    runner = EpisodeRunner(client, harness(config, images), concurrency=teacher.concurrency,
                           limits=Limits(max_steps=teacher.max_turns), pool=pool)
    collection = await collect(runner, tasks.sft, samples=teacher.samples, cap_per_site=teacher.cap_per_site,
                               run_seed=config.seed)
    save_trajectories(path, collection.kept)
    summary = collection.summary()
    log.info("teacher: %s", summary)
    stage.finish(summary)
    return collection.kept, summary, stage.fingerprint


def tokenizer_stage(config: GUIConfig, workdir: str, trajectories: Sequence[Trajectory], teacher: str,
                    rerun: bool) -> tuple[Tokenizer, str, str]:
    """Stage 3: the tokenizer ``tokenizer.path`` names, or a BPE of the teacher text (the harness's
    system prompt and tool schemas included) with the chat and vision special tokens."""
    return shared_tokenizer_stage(
        config, workdir, trajectories, teacher, rerun,
        texts=lambda kept: [SYSTEM_PROMPT, json.dumps(TOOLS, ensure_ascii=False), *message_texts(kept)],
        special_tokens=SPECIAL_TOKENS)


def fresh_model(config: GUIConfig, tokenizer: Tokenizer) -> Transformer:
    """The policy SFT starts from: ``model.path``, or a fresh vision-language model over ``tokenizer``."""
    ids = tuple(tokenizer.token_id(token) for token in ("<|image_pad|>", "<|vision_start|>", "<|vision_end|>"))
    return build_model(config.model, config.seed, tokenizer.vocab_size, vision_tokens=ids)


def sft_stage(config: GUIConfig, workdir: str, trajectories: Sequence[Trajectory], tokenizer: Tokenizer,
              tokenizer_dir: str, images: ImageStore, inputs: dict[str, str], rerun: bool) -> tuple[str, str]:
    """Stage 4: every assistant turn of the teacher's trajectories its own example, under the view the
    policy samples with; returns the trained policy's directory (with its tokenizer) and fingerprint."""
    model = fresh_model(config, tokenizer)
    vlm = model.config
    chat_format = model_chat_format(config.chat_format, tokenizer, model)
    view = latest_images(config.rl.context_images) if config.rl.context_images >= 0 else None
    data = Stage(os.path.join(workdir, "sft_data"), "sft_data", config.examples,
                 {**inputs, "context_images": str(config.rl.context_images), "seq_len": str(config.sft.seq_len)})
    table_path = os.path.join(data.directory, "images.json")
    if data.open(rerun) != "done":
        table = ImageTable(vlm, images)
        order = list(trajectories)
        random.Random(config.seed).shuffle(order)
        held = max(1, round(config.examples.eval_fraction * len(order))) if config.examples.eval_fraction else 0
        written, too_long = 0, 0
        for name, part in (("eval", order[:held]), ("train", order[held:])):
            with open(os.path.join(data.directory, f"{name}.jsonl"), "w") as handle:
                for trajectory in part:
                    for example in turn_examples(trajectory, chat_format, view, table):
                        if len(example["token_ids"]) > config.sft.seq_len + 1:  # truncation would cut the turn
                            too_long += 1
                            continue
                        handle.write(json.dumps(example) + "\n")
                        written += 1
        if too_long:
            log.warning("%d SFT examples are longer than sft.seq_len + 1 (%d) and were left out", too_long,
                        config.sft.seq_len + 1)
        table.save(table_path)
        data.finish({"trajectories": len(order), "eval_trajectories": held, "examples": written,
                     "too_long": too_long, "images": len(table.refs)})
    table = ImageTable.load(table_path, vlm, images)
    directory = os.path.join(workdir, "sft")
    eval_path = os.path.join(data.directory, "eval.jsonl")
    train_and_evaluate(config.sft, directory, examples=os.path.join(data.directory, "train.jsonl"),
                       eval_examples=eval_path if os.path.getsize(eval_path) else "",
                       vocab_size=tokenizer.vocab_size, inputs={"examples": data.fingerprint}, rerun=rerun,
                       images=table, model=model)
    model_dir = os.path.join(directory, "model")
    if not os.path.exists(os.path.join(model_dir, "tokenizer.json")):
        Tokenizer.from_pretrained(tokenizer_dir).save_pretrained(model_dir)
    return model_dir, made_by(directory)


def by_actions(evaluation: Evaluation, tasks: Sequence[MiniWoBTask]) -> dict[str, float]:
    """Success per number of actions the page needs (the catalogue's oracle count, its minimum)."""
    need = {task.id: CATALOGUE[task.page].actions[0] for task in tasks}
    rates: dict[int, list[bool]] = {}
    for task_id, trials in evaluation.trials.items():
        rates.setdefault(need[task_id], []).extend(trials)
    return {f"{n} actions": sum(t) / len(t) for n, t in sorted(rates.items())}


async def evaluation_stage(config: GUIConfig, workdir: str, client: AsyncSandboxClient, pool: SandboxPool | None,
                           images: ImageStore, name: str, pass_: str, held_out: str, model: Transformer,
                           tokenizer: Tokenizer, tasks: Sequence[MiniWoBTask], inputs: dict[str, str],
                           rerun: bool) -> dict[str, float]:
    """Stage 5: the success rate of ``model`` over one held-out set, greedy (one episode a task) or
    sampled (``eval.samples`` a task at the rollouts' temperature); the episodes are kept."""
    samples, temperature = (1, 0.0) if pass_ == "greedy" else (config.eval.samples, config.rl.rollout.temperature)
    settings = {"pass": pass_, "samples": samples, "temperature": temperature, "rollout": config.rl.rollout,
                "chat_format": config.chat_format, "seed": config.seed, "context_images": config.rl.context_images,
                "elements": config.harness.elements}
    stage = Stage(os.path.join(workdir, "eval", f"{name}_{pass_}_{held_out}"), "eval", settings,
                  {**inputs, "tasks": fingerprint(sorted(t.id for t in tasks))})
    result_path = os.path.join(stage.directory, "result.json")
    if stage.open(rerun) == "done":
        return read_json(result_path)
    chat_format: ChatFormat = model_chat_format(config.chat_format, tokenizer, model)
    policy = make_policy(config.rl, JaxEngine(model, tokenizer), chat_format, temperature=temperature, images=images)
    runner = config.rl.rollout.runner(client, harness(config, images), policy, pool=pool)
    evaluation = await evaluate_policy(runner, tasks, samples, seed=config.seed,
                                       name=f"eval {name} {pass_} {held_out.replace('_', ' ')}")
    result = {**evaluation.metrics(), **by_actions(evaluation, tasks), **loop_seconds(evaluation.trajectories)}
    save_trajectories(episodes_path(stage.directory), evaluation.trajectories)
    write_json(result_path, result)
    stage.finish()
    return result


async def run_recipe(config: ConfigDict, workdir: str, *, rerun: bool = False) -> GUIResult:
    """The stages of Orchard-GUI over ``workdir``; see the module docstring."""
    settings = gui_config(config)
    os.makedirs(workdir, exist_ok=True)
    write_json(os.path.join(workdir, "config.json"), config)
    images = ImageStore(os.path.join(workdir, "images"))
    clock = Clock()
    held: dict[str, dict[str, dict[str, dict[str, float]]]] = {name: {} for name in HELD_OUT}
    rl_start = "sft" if settings.sft.num_steps else "init"
    with orchestrator(settings.env.url, settings.env.api_key) as endpoint:
        client = endpoint.async_client()
        pool = SandboxPool(settings.harness.pool) if settings.harness.pool else None
        try:
            tasks, tasks_made_by = await tasks_stage(settings, workdir, client, rerun)
            clock.lap("tasks")
            trajectories, teacher, teacher_made_by = await teacher_stage(settings, workdir, client, pool, images,
                                                                         tasks, tasks_made_by, rerun)
            clock.lap("collect")
            tokenizer, tokenizer_dir, tokenizer_made_by = tokenizer_stage(settings, workdir, trajectories,
                                                                          teacher_made_by, rerun)
            mesh = settings.mesh.make()

            async def evaluate(name: str, model: Transformer, made_by: str, passes: Sequence[str]) -> None:
                for held_out in HELD_OUT:
                    held_tasks = getattr(tasks, held_out)
                    if held_tasks:
                        held[held_out][name] = {
                            pass_: await evaluation_stage(settings, workdir, client, pool, images, name, pass_,
                                                          held_out, model, tokenizer, held_tasks,
                                                          {"policy": made_by, "tasks": tasks_made_by}, rerun)
                            for pass_ in passes}

            def policy_model(directory: str) -> Transformer:
                return trained_policy(settings, directory, mesh)

            init_made_by = fingerprint({"model": settings.model, "tokenizer": tokenizer_made_by, "seed": settings.seed})
            await evaluate("init", fresh_model(settings, tokenizer), init_made_by,
                           PASSES if rl_start == "init" else ["greedy"])
            clock.lap("evaluate")
            policy_dir, policy_made_by = "", init_made_by
            if settings.sft.num_steps:
                policy_dir, policy_made_by = sft_stage(settings, workdir, trajectories, tokenizer, tokenizer_dir,
                                                       images, {"teacher": teacher_made_by,
                                                                "tokenizer": tokenizer_made_by}, rerun)
                clock.lap("sft")
                await evaluate("sft", policy_model(policy_dir), policy_made_by, PASSES)
                clock.lap("evaluate")
            elif settings.model.path:  # RL straight from a checkpoint
                policy_dir = resolve(settings.model.path)
            else:  # RL from the freshly initialised model (the ablation of notebooks/gui_rl_init.ipynb)
                policy_dir = os.path.join(workdir, "init_model")
                if not os.path.exists(os.path.join(policy_dir, "config.json")):
                    save_pretrained(fresh_model(settings, tokenizer), policy_dir)
                    tokenizer.save_pretrained(policy_dir)
            rl_dir = os.path.join(workdir, "rl")
            await train_rl(settings.rl, rl_dir, client, tasks.rl, harness(settings, images), policy=policy_dir,
                           tokenizer=tokenizer_dir, inputs={"policy": policy_made_by, "tasks": tasks_made_by},
                           rerun=rerun, images=images, pool=pool,
                           held_out={name: getattr(tasks, name) for name in HELD_OUT if getattr(tasks, name)})
            clock.lap("rl")
            await evaluate("rl", policy_model(os.path.join(rl_dir, "model")), made_by(rl_dir), PASSES)
            clock.lap("evaluate")
        finally:
            if pool is not None:
                await pool.close()
            await client.aclose()
    rl_change = {held_out: sampled_change(os.path.join(workdir, "eval", f"{rl_start}_sampled_{held_out}"),
                                          os.path.join(workdir, "eval", f"rl_sampled_{held_out}"))
                 for held_out in HELD_OUT if getattr(tasks, held_out)}
    actions = {held_out: {stage: {k: v for k, v in passes["greedy"].items() if k.endswith("actions")}
                          for stage, passes in stages.items()} for held_out, stages in held.items()}
    rl_metrics = read_metrics(rl_dir)
    result = GUIResult(held_out=held, by_actions=actions, rl_change=rl_change, rl_metrics=rl_metrics,
                       tasks=tasks.counts(), teacher=teacher, seconds=clock.seconds,
                       variant={"elements": settings.harness.elements, "context_images": settings.rl.context_images},
                       browser_share=browser_share(teacher, held, rl_metrics))
    write_json(os.path.join(workdir, "summary.json"), result.to_dict())
    return result


def run(config: ConfigDict, workdir: str, *, rerun: bool = False) -> GUIResult:
    """:func:`run_recipe` from synchronous code."""
    return asyncio.run(run_recipe(config, workdir, rerun=rerun))


SHARED_STAGES = ("images", "tasks", "teacher", "tokenizer")  # what both arms of the RL-init ablation use


def run_rl_init_ablation(config: ConfigDict, workdir: str, *, rerun: bool = False) -> dict[str, GUIResult]:
    """:func:`arun_rl_init_ablation` from synchronous code."""
    return asyncio.run(arun_rl_init_ablation(config, workdir, rerun=rerun))


async def arun_rl_init_ablation(config: ConfigDict, workdir: str, *, rerun: bool = False) -> dict[str, GUIResult]:
    """The paper's Figure 7 question: GRPO from the SFT checkpoint (``from_sft``) against GRPO from the
    initial model (``from_init``, ``sft.num_steps = 0``) at an equal rollout budget (the same RL config).
    Both arms share one set of tasks, teacher trajectories and tokenizer (the second arm's folders link
    to the first's), so they differ in where RL starts and nothing else. Each arm is a recipe workdir:
    a rerun reuses what is done."""
    arms = {"from_sft": config, "from_init": config.copy_and_resolve_references()}
    arms["from_init"].sft.num_steps = 0
    results = {}
    for name, arm in arms.items():
        directory = os.path.join(workdir, name)
        os.makedirs(directory, exist_ok=True)
        if name != "from_sft":
            for stage in SHARED_STAGES:
                link, target = os.path.join(directory, stage), os.path.join(workdir, "from_sft", stage)
                if not os.path.lexists(link) and os.path.exists(target):
                    os.symlink(os.path.abspath(target), link)
        results[name] = await run_recipe(arm, directory, rerun=rerun)
    write_json(os.path.join(workdir, "summary.json"), {name: r.to_dict() for name, r in results.items()})
    return results
