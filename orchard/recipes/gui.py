"""Orchard-GUI as a task family of the recipe runner: MiniWoB++ tasks, teacher trajectories through the real browser, per-turn
SFT of a vision-language policy, multi-turn GRPO with the paper's reward, and held-out evaluation.

``python experiments/gui_grpo/run.py`` runs it (:mod:`orchard.recipes.runner` has the stages and the
workdir; ``images/`` holds every screenshot by content hash, and ``rl/`` also ``curriculum.json``).

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
more than the other. ``harness.marks`` is set-of-marks (``configs/gui_grpo.py:marks``): the elements
listed with marks and four compact tools that act on a mark, the oracle teacher writing those calls
(:func:`~orchard.tasks.gui.oracle.mark_action`). ``harness.tools`` names the tools the policy is given: the paper's 13 by default,
fewer where the pages need fewer (the smoke config's pages take clicks: ``click`` and ``done``, and its
rows are half as long).
"""

from __future__ import annotations

import functools
import json
import logging
import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ml_collections import ConfigDict

from orchard.config import from_config
from orchard.data.chat import VL_FORMATS
from orchard.data.examples import latest_images
from orchard.data.images import ImageStore
from orchard.data.tokenizer import Tokenizer
from orchard.data.trajectory import Trajectory, read_trajectories, save_trajectories
from orchard.data.vision_rows import ImageTable
from orchard.eval.runner import Evaluation
from orchard.harness.browser import (
    MARK_TOOLS,
    MARKS_SYSTEM_PROMPT,
    SYSTEM_PROMPT,
    TOOL_NAMES,
    TOOLS,
    BrowserHarness,
)
from orchard.harness.chromium import BrowserSettings
from orchard.harness.core import DEFAULT_MAX_TURNS, Harness, Limits
from orchard.harness.episode import EpisodeRunner, SandboxPool
from orchard.models.build import build_model
from orchard.models.transformer import Transformer
from orchard.recipes.family import Context, Family, Split, Teaching
from orchard.recipes.sft_data import build_turn_examples
from orchard.recipes.stages import Made, SharedStages, message_texts, sft_stage, shared_stages
from orchard.rollout.jax_engine import model_chat_format
from orchard.tasks.gui.collect import collect, gui_splits, loop_seconds, oracle_teacher
from orchard.tasks.gui.miniwob import (
    CATALOGUE,
    load_instances,
    read_instances,
    save_instances,
    success_by_actions,
)
from orchard.workdir import Stage

log = logging.getLogger(__name__)
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
    max_turns: int = DEFAULT_MAX_TURNS
    concurrency: int = 2


@dataclass(frozen=True)
class GUIHarnessConfig:
    elements: bool = False  # the page's element list beside the screenshot (see the module docstring)
    marks: bool = False  # set-of-marks: the elements listed with marks, and the marks mode's tools instead
    tools: tuple[str, ...] = TOOL_NAMES  # the tools the policy is given, by name: the paper's 13, or fewer
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


async def tasks_stage(ctx: Context) -> Split:
    """Every instance of the split, with the instruction its page asks (read in browsers)."""
    config: GUIConfig = ctx.settings
    tasks = config.tasks
    if unknown := [page for page in tasks.pages if page not in CATALOGUE]:
        raise ValueError(f"pages {unknown} are not in the MiniWoB catalogue (orchard.tasks.gui.miniwob.CATALOGUE)")
    splits = gui_splits(tasks.pages, tasks.sft_seeds + tasks.rl_seeds, tasks.held_out_seeds,
                        tasks.held_out_page_fraction, config.seed)
    groups = {"sft": [(p, s) for p, s in splits.train if s < tasks.sft_seeds],
              "rl": [(p, s) for p, s in splits.train if s >= tasks.sft_seeds],
              "held_out_seed": splits.held_out_seed, "held_out_task": splits.held_out_task}
    stage = Stage(os.path.join(ctx.workdir, "tasks"), "tasks", tasks, {"seed": str(config.seed)})
    path = os.path.join(stage.directory, "instances.jsonl")
    settings = BrowserSettings(viewport=tuple(tasks.viewport))
    if stage.open(ctx.rerun) != "done":
        built = await read_instances(ctx.client, [pair for group in groups.values() for pair in group], settings,
                                     tasks.concurrency)
        save_instances(path, built)
        stage.finish({"instances": len(built)})
    by_key = load_instances(path, settings)
    picked = {name: [by_key[pair] for pair in pairs] for name, pairs in groups.items()}
    return Split(sft=picked["sft"], rl=picked["rl"], held_out={name: picked[name] for name in HELD_OUT},
                 made_by=stage.fingerprint)


def harness_tools(names: Sequence[str]) -> list[dict[str, Any]]:
    """The schemas of the browser tools ``names`` (``harness.tools``), in the harness's own order."""
    return [dict(tool) for tool in TOOLS if tool["function"]["name"] in names]


def harness(ctx: Context) -> BrowserHarness:
    config: GUIConfig = ctx.settings
    return BrowserHarness(images=ctx.images, elements=config.harness.elements,
                          context_images=max(config.rl.context_images, 0), tools=harness_tools(config.harness.tools),
                          marks=config.harness.marks)


async def teacher_stage(ctx: Context, split: Split) -> Teaching:
    """The oracle on every SFT instance; the shortest success per instance, at most K per page."""
    config: GUIConfig = ctx.settings
    stage = Stage(os.path.join(ctx.workdir, "teacher"), "teacher", config.teacher,
                  {"tasks": split.made_by, "elements": str(config.harness.elements),
                   "tools": ",".join(config.harness.tools), "marks": str(config.harness.marks)})
    path = os.path.join(stage.directory, "trajectories.jsonl")
    if stage.open(ctx.rerun) == "done":
        return Teaching(list(read_trajectories(path)), stage.summary(), stage.fingerprint)
    teacher = config.teacher
    runner = EpisodeRunner(ctx.client, harness(ctx), concurrency=teacher.concurrency,
                           limits=Limits(max_turns=teacher.max_turns), pool=ctx.pool)
    collection = await collect(runner, split.sft, samples=teacher.samples, cap_per_site=teacher.cap_per_site,
                               run_seed=config.seed, teacher=functools.partial(oracle_teacher, marks=config.harness.marks))
    save_trajectories(path, collection.kept)
    summary = collection.summary()
    log.info("teacher: %s", summary)
    stage.finish(summary)
    return Teaching(collection.kept, summary, stage.fingerprint)


def browser_share(teacher: dict[str, Any], held: dict[str, Any], rl_metrics: dict[int, dict[str, float]]
                  ) -> dict[str, float]:
    """Per stage that runs episodes, the share of its agent loops' time spent in the environment (the
    browser's actions and observations) rather than in the policy."""
    def share(env: float, policy: float) -> float:
        return env / (env + policy) if env + policy else 0.0

    evals = [p for harnesses in held.values() for stages in harnesses.values() for passes in stages.values()
             for p in passes.values()]
    return {"collect": share(teacher.get("env_s", 0.0), teacher.get("policy_s", 0.0)),
            "evaluate": share(sum(p.get("env_s", 0.0) for p in evals), sum(p.get("policy_s", 0.0) for p in evals)),
            "rl": share(sum(m.get("env_s", 0.0) for m in rl_metrics.values()),
                        sum(m.get("policy_s", 0.0) for m in rl_metrics.values()))}


class GUIFamily(Family):
    name = "gui"
    title = "Orchard-GUI: held-out success"
    special_tokens = SPECIAL_TOKENS

    def typed(self, config: ConfigDict) -> GUIConfig:
        return gui_config(config)

    def check(self, config: GUIConfig) -> list[str]:
        problems = []
        tasks, rl = config.tasks, config.rl
        if unknown := [page for page in tasks.pages if page not in CATALOGUE]:
            problems.append(f"tasks.pages: {unknown} are not in the MiniWoB catalogue")
        if config.harness.marks and config.harness.elements:
            problems.append("harness: marks lists the elements itself; set marks or elements, not both")
        if unknown := sorted(set(config.harness.tools) - set(TOOL_NAMES)):
            problems.append(f"harness.tools: {unknown} are not browser tools (one of {', '.join(TOOL_NAMES)})")
        if not tasks.pages or tasks.sft_seeds < 1 or tasks.rl_seeds < 1:
            problems.append("tasks: need pages, and at least one SFT seed and one RL seed")
        if config.chat_format not in VL_FORMATS:
            problems.append(f"chat.format: {config.chat_format!r} has no image tokens; one of {', '.join(VL_FORMATS)}")
        if not config.model.path and "vision" not in config.model.init:
            problems.append("model: a path to a vision-language model, or an init with text and vision blocks")
        if config.pretrain.num_steps:
            problems.append("pretrain: copying lessons are for a text policy (a fresh VLM's SFT builds its own model)")
        if rl.rows_per != "turn" and rl.context_images >= 0:
            problems.append("rl.rows_per must be 'turn' when prompts show only the latest screenshots (context_images)")
        if config.sft.images_per_row < 1 or rl.images_per_row < 1:
            problems.append("sft.images_per_row and rl.images_per_row must be at least 1")
        if rl.curriculum.stages and rl.curriculum.stages[-1].max_turns > rl.rollout.max_turns:
            problems.append(f"rl.curriculum: its last stage allows {rl.curriculum.stages[-1].max_turns} steps, more "
                            f"than rl.rollout.max_turns ({rl.rollout.max_turns})")
        return problems

    def open(self, ctx: Context) -> None:
        ctx.images = ImageStore(os.path.join(ctx.workdir, "images"))
        pool = ctx.settings.harness.pool
        ctx.pool = SandboxPool(pool) if pool else None

    async def tasks(self, ctx: Context) -> Split:
        return await tasks_stage(ctx)

    async def teach(self, ctx: Context, split: Split) -> Teaching:
        return await teacher_stage(ctx, split)

    def tokenizer_texts(self, trajectories: Sequence[Trajectory]) -> list[str]:
        # every tool's schema, whichever harness.tools gives the policy: one tokenizer for any subset or mode
        return [SYSTEM_PROMPT, MARKS_SYSTEM_PROMPT, json.dumps(TOOLS, ensure_ascii=False),
                json.dumps(MARK_TOOLS, ensure_ascii=False), *message_texts(trajectories)]

    def fresh_model(self, ctx: Context, tokenizer: Tokenizer) -> Transformer:
        ids = tuple(tokenizer.token_id(token) for token in ("<|image_pad|>", "<|vision_start|>", "<|vision_end|>"))
        return build_model(ctx.settings.model, ctx.settings.seed, tokenizer.vocab_size, vision_tokens=ids)

    def sft(self, ctx: Context, workdir: str, trajectories: Sequence[Trajectory], tokenizer: Tokenizer,
            tokenizer_made: Made, inputs: dict[str, str]) -> Made:
        config: GUIConfig = ctx.settings
        model = self.fresh_model(ctx, tokenizer)
        assert ctx.images is not None
        images = ctx.images
        chat_format = model_chat_format(config.chat_format, tokenizer, model)
        view = latest_images(config.rl.context_images) if config.rl.context_images >= 0 else None

        def write(directory: str) -> dict[str, Any]:
            return build_turn_examples(directory, trajectories, chat_format, view, ImageTable(model.config, images),
                                       seed=config.seed, eval_fraction=config.examples.eval_fraction,
                                       max_tokens=config.sft.seq_len + 1)

        return sft_stage(
            config, workdir, config.examples, write, tokenizer_made.directory,
            {**inputs, "context_images": str(config.rl.context_images), "seq_len": str(config.sft.seq_len)},
            ctx.rerun, lambda data: {"images": ImageTable.load(os.path.join(data, "images.json"), model.config, images),
                                     "model": model})

    def eval_harnesses(self, ctx: Context) -> dict[str, Harness]:
        return {"browser": harness(ctx)}

    def eval_label(self, stage: str, pass_: str, held_out: str, harness: str) -> str:
        return f"eval {stage} {pass_} {held_out.replace('_', ' ')}"

    def eval_settings(self, settings: GUIConfig) -> dict[str, Any]:
        return {"context_images": settings.rl.context_images, "elements": settings.harness.elements,
                "tools": ",".join(settings.harness.tools)}

    def policy_options(self, ctx: Context) -> dict[str, Any]:
        return {"images": ctx.images}

    def eval_metrics(self, ctx: Context, split: Split, held_out: str, evaluation: Evaluation) -> dict[str, Any]:
        return {**success_by_actions(evaluation.trials, split.held_out[held_out]),
                **loop_seconds(evaluation.trajectories)}

    def rl_options(self, ctx: Context, split: Split) -> dict[str, Any]:
        return {"images": ctx.images, "pool": ctx.pool,
                "held_out": {name: tasks for name, tasks in split.held_out.items() if tasks}}

    def summary_extras(self, ctx: Context, held_out: dict[str, Any], teaching: Teaching,
                       rl_metrics: dict[int, dict[str, float]]) -> dict[str, Any]:
        config: GUIConfig = ctx.settings
        return {"variant": {"elements": config.harness.elements, "context_images": config.rl.context_images},
                "browser_share": browser_share(teaching.summary, held_out, rl_metrics)}


GUI = GUIFamily()
