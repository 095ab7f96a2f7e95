"""The contract between a task family and the recipe runner (:mod:`orchard.recipes.runner`).

A family says what only it knows: its typed config and the checks on it, how its tasks are built and
split, its teacher, the text its tokenizer learns, its fresh model, how its SFT examples are written,
the harnesses its policies are evaluated and trained in, and what an evaluation measures beside the
runner's own metrics (resolve rate, avg@k, pass@k, pass^k). :class:`Family` holds the defaults a text
family uses; a family file overrides the rest (``swe.py``, ``gui.py``, ``claw.py``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from jax.sharding import Mesh
from ml_collections import ConfigDict

from orchard.config import ConfigError, missing_fields
from orchard.data.images import ImageStore
from orchard.data.tokenizer import Tokenizer
from orchard.data.trajectory import Trajectory
from orchard.env import AsyncSandboxClient
from orchard.eval.runner import Evaluation
from orchard.harness.core import Harness
from orchard.harness.episode import SandboxPool, SetupCache
from orchard.harness.task import Task
from orchard.models.build import build_model
from orchard.models.transformer import Transformer
from orchard.recipes.stages import (
    COPIED_FIELDS,
    PASSES,
    Made,
    SharedStages,
    content_texts,
    pretrain_problems,
    rl_problems,
)


@dataclass
class Context:
    """One run of a recipe: its typed config, workdir and the live resources its stages share."""

    settings: Any  # the family's typed config, a SharedStages
    workdir: str
    rerun: bool
    client: AsyncSandboxClient
    mesh: Mesh | None = None
    setups: SetupCache | None = None  # SWE: every episode of a task forks one set-up of it
    pool: SandboxPool | None = None  # GUI and Claw: sandboxes kept between episodes
    images: ImageStore | None = None  # GUI: every screenshot, by content hash

    async def close(self) -> None:
        if self.setups is not None:
            await self.setups.close()
        if self.pool is not None:
            await self.pool.close()


@dataclass
class Split:
    """A family's tasks: SFT's (the teacher's), RL's prompts, and each held-out set, by name."""

    sft: list[Task]
    rl: list[Task]
    held_out: dict[str, list[Task]]
    made_by: str  # the fingerprint of the tasks stage
    extras: dict[str, Any] = field(default_factory=dict)  # what a family's metrics need of its split

    def counts(self) -> dict[str, int]:
        return {"sft": len(self.sft), "rl": len(self.rl), **{name: len(t) for name, t in self.held_out.items()}}


@dataclass
class Teaching:
    """The teacher's kept episodes, what collection reports of them, and the stage's fingerprint."""

    trajectories: list[Trajectory]
    summary: dict[str, Any]
    made_by: str


class Family:
    """A task family as the runner sees it. Subclasses set :attr:`name` and override the abstract steps."""

    name = ""
    title = ""  # the table's title
    measures: tuple[str, ...] = ("resolve_rate",)  # what the report shows of every evaluation, headline first
    special_tokens: Sequence[str] | None = None  # the trained BPE's; None: Tokenizer.train's
    unread_fields: tuple[str, ...] = ()  # stage config fields this family's stages never read (a text family's image settings)

    # -- config --
    def typed(self, config: ConfigDict) -> SharedStages:
        raise NotImplementedError

    def check(self, settings: Any) -> list[str]:
        """The family's own problems with a typed config (the RL stage's are added by the runner)."""
        return []

    def config_gaps(self, config: ConfigDict) -> list[str]:
        """The fields the family's stages read that ``config`` leaves to the code's defaults: a shipped config
        names every one, so that the file is the record of a run."""
        settings, values = self.typed(config), config.to_dict()
        gaps: list[str] = []
        for stage_field in dataclasses.fields(settings):
            typed = getattr(settings, stage_field.name)
            if not dataclasses.is_dataclass(typed):
                continue
            block = values["sft"]["examples"] if stage_field.name == "examples" else values[stage_field.name]
            if stage_field.name == "sft":
                block = {name: value for name, value in block.items() if name != "examples"}
            gaps += missing_fields(type(typed), block, stage_field.name)
        return [gap for gap in gaps if gap not in COPIED_FIELDS + self.unread_fields]

    def check_config(self, config: ConfigDict) -> list[str]:
        """Every inconsistency of a config that would only surface deep into a run: a field that does not
        fit its stage's config (:func:`~orchard.config.from_config`), then the settings that do not fit
        each other (the family's, then the RL stage's)."""
        try:
            settings = self.typed(config)
        except (ConfigError, KeyError) as exc:
            return [f"{exc}" if isinstance(exc, ConfigError) else f"missing config block {exc}"]
        return self.check(settings) + pretrain_problems(settings) + rl_problems(settings)

    # -- stages --
    def open(self, ctx: Context) -> None:
        """Set up the resources the family's episodes share (``ctx.setups``, ``ctx.pool``, ``ctx.images``)."""

    async def tasks(self, ctx: Context) -> Split:
        raise NotImplementedError

    async def teach(self, ctx: Context, split: Split) -> Teaching:
        raise NotImplementedError

    def teaches(self, settings: Any) -> bool:
        """Whether the config runs the teacher (a run from a given policy and tokenizer may not)."""
        return True

    def tokenizer_texts(self, trajectories: Sequence[Trajectory]) -> list[str]:
        return content_texts(trajectories)

    def fresh_model(self, ctx: Context, tokenizer: Tokenizer) -> Transformer:
        """The policy SFT starts from (and the one evaluated at init)."""
        return build_model(ctx.settings.model, ctx.settings.seed, tokenizer.vocab_size, ctx.mesh)

    def sft(self, ctx: Context, workdir: str, trajectories: Sequence[Trajectory], tokenizer: Tokenizer,
            tokenizer_made: Made, inputs: dict[str, str]) -> Made:
        raise NotImplementedError

    # -- evaluation --
    def eval_harnesses(self, ctx: Context) -> dict[str, Harness]:
        raise NotImplementedError

    def passes(self, stage: str, rl_start: str) -> tuple[str, ...]:
        """Greedy at every stage; sampled too after SFT, where RL starts and after RL."""
        return PASSES if stage in (rl_start, "sft", "rl") else ("greedy",)

    def eval_label(self, stage: str, pass_: str, held_out: str, harness: str) -> str:
        """The evaluation's name: its progress bar, and its episodes' seed purpose."""
        return f"eval {stage} {pass_} {held_out.replace('_', ' ')} {harness}"

    def eval_settings(self, settings: Any) -> dict[str, Any]:
        """What else decides an evaluation's episodes, for its stage record."""
        return {}

    def policy_options(self, ctx: Context) -> dict[str, Any]:
        """Extra arguments of :func:`~orchard.train.rl.make_policy` (a VLM's image store)."""
        return {}

    def eval_metrics(self, ctx: Context, split: Split, held_out: str, evaluation: Evaluation) -> dict[str, Any]:
        """What the family measures of an evaluation beside :meth:`Evaluation.metrics`."""
        return {}

    # -- RL --
    def rl_harness(self, ctx: Context) -> Harness:
        return next(iter(self.eval_harnesses(ctx).values()))

    def rl_options(self, ctx: Context, split: Split) -> dict[str, Any]:
        """Extra arguments of :func:`~orchard.train.rl.train_rl` (set-up cache, pool, images, held-out sets)."""
        return {"setups": ctx.setups, "pool": ctx.pool, "images": ctx.images}

    # -- summary --
    def summary_extras(self, ctx: Context, held_out: dict[str, Any], teaching: Teaching,
                       rl_metrics: dict[int, dict[str, float]]) -> dict[str, Any]:
        return {}
