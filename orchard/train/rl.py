"""The RL loop over any task family: rollouts in sandboxes, groups from a group sampler, a GRPO update,
a weight sync.

Each step draws ``prompts_per_step`` tasks (:class:`~orchard.harness.task.Task`: SWE, GUI, Claw or
your own). For each, the group sampler (:mod:`orchard.train.bar`: BAR, fixed-N GRPO or dynamic
filtering) asks for rollouts ``k`` at a time; a rollout is one graded episode
(:class:`~orchard.harness.episode.EpisodeRunner`: a fresh sandbox, ``task.setup``, the harness
driven by the policy, ``task.grade``, the sandbox always deleted), run concurrently up to
``rollout.concurrency`` sandboxes. The reward is the task's (``Outcome.reward``). A reward of
``None`` drops the rollout everywhere (it is in no group, no row and no mean): the task's grader
said the episode tells nothing of the policy, the engine or the sandbox failed, or the episode ran
out of its wall-clock budget, which the paper excludes from training rather than scoring as a
failure. The chosen groups become GRPO rows (:mod:`orchard.train.rollouts`, per trajectory or per
turn) for the update of the shared train step with the clipped policy loss
(:mod:`orchard.train.grpo`), and the new weights go to the engine before the next step's rollouts
(immediate for :class:`~orchard.rollout.jax_engine.JaxEngine`; through a weight sync for
:class:`~orchard.rollout.openai_engine.OpenAIEngine` and vLLM).

Every episode's seed is :func:`~orchard.seeds.episode_seed` of (run seed, step, task id,
sample index): a rerun samples the same rollouts whatever order they finish in.

With ``max_staleness`` K > 0 the loop is asynchronous (:mod:`orchard.train.pipeline`): the rollouts of the
next K steps are generated while the learner updates on this one's, at most K weight syncs behind, and an
episode in flight across a sync continues under the new weights.

Before the first step, ``pass_filter`` can keep only the tasks whose pass rate under the initial
policy lies in a window (:func:`filter_by_pass_rate`), as the paper's RL set does.

Metrics per step: reward, resolve rate, informative-group fraction, rollouts per group, fallbacks,
dropped rollouts, tokens per second, and the time split between rollouts and learning; and whether RL
stays near where it started (:func:`orchard.train.grpo.policy_diagnostics`, logged, never trained on):
the clip fraction, the KL to the behaviour policy, the sampled tokens' entropy and the KL to the start
policy, whose logprobs of each update batch come from one forward pass under the initial parameters,
kept when the run starts (a resumed run reloads them from ``policy``, not from its checkpoint).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from tqdm.auto import tqdm

from orchard.data.chat import ChatFormat
from orchard.data.examples import ContextView, latest_images
from orchard.data.images import ImageStore
from orchard.data.tokenizer import Tokenizer
from orchard.data.trajectory import Trajectory
from orchard.data.vision_rows import IMAGE_FEATURES, ImageTable
from orchard.distributed import broadcast, global_batch, is_controller, is_multiprocess, lead
from orchard.env.client import AsyncSandboxClient
from orchard.eval.runner import RolloutConfig, evaluate_policy, require_environment
from orchard.harness.core import Harness, Policy
from orchard.harness.episode import EpisodeRunner, SandboxPool, SetupCache
from orchard.harness.policies import EnginePolicy
from orchard.harness.task import Task
from orchard.models.build import ModelSpec, build_model
from orchard.models.sharding import MeshConfig
from orchard.models.vision import Grid
from orchard.models.vlm import VLMConfig
from orchard.models.weights import ModelWeights
from orchard.rollout.engine import RolloutEngine
from orchard.rollout.jax_engine import JaxEngine, model_chat_format
from orchard.rollout.openai_engine import OpenAIEngine, ReloadFromDisk, WeightSync
from orchard.seeds import episode_seed, seeded_random
from orchard.train.bar import GroupResult, GroupSampler, SamplerConfig, make_sampler
from orchard.train.checkpoint import Checkpointer
from orchard.train.curriculum import CurriculumConfig
from orchard.train.grpo import group_advantages, make_policy_loss, make_reference_logprobs
from orchard.train.images import attach_images
from orchard.train.metrics import MetricsWriter, read_metrics
from orchard.train.pipeline import RolloutPipeline, drop_stale
from orchard.train.rollouts import RowsPer, pack_rollouts, policy_rows
from orchard.train.state import (
    OptimConfig,
    TrainState,
    batch_sharding,
    init_state,
    make_optimizer,
    make_train_step,
)
from orchard.workdir import Stage, read_json, write_json

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class EngineConfig:
    """The rollout engine: ``jax`` (in process, over the learner's own parameters) or ``vllm`` /
    ``openai`` (a server at ``url``, or replicas at comma-separated URLs, serving ``served_model`` from
    ``weights_dir``). ``weight_sync`` says how their weights follow the learner's: ``disk`` writes each
    update as ``<weights_dir>/v<version>`` and asks them to reload from there
    (:class:`~orchard.rollout.openai_engine.ReloadFromDisk`); ``nccl`` broadcasts the tensors from the
    learner's GPUs to vLLM's workers over vLLM's native weight transfer, in the dtype of
    ``weights_dir``'s config, with this host reachable at ``nccl_master_address:nccl_master_port``
    (:class:`~orchard.rollout.weight_transfer.NcclWeightTransfer`; vLLM started with
    ``--weight-transfer-config '{"backend": "nccl"}'``). ``prefix_cache_mb`` (``jax``): the sampler's prefix
    cache (:mod:`orchard.rollout.prefix_cache`), so that a turn prefills only what the conversation added
    since the last (0: off); evaluation's in-process engine takes it too."""

    kind: str = "jax"
    url: str = ""
    served_model: str = ""
    weights_dir: str = ""
    api_key: str = "EMPTY"
    weight_sync: str = "disk"  # disk | nccl
    nccl_master_address: str = ""  # an address of the learner's host that the vLLM workers reach
    nccl_master_port: int = 29500
    prefix_cache_mb: int = 0


@dataclass(frozen=True)
class PassFilterConfig:
    """Keep the tasks whose pass rate ``p`` over ``samples`` rollouts has ``low < p <= high`` (0: off)."""

    samples: int = 0
    low: float = 0.0
    high: float = 0.5


@dataclass(frozen=True)
class RLConfig:
    seed: int = 0
    num_steps: int = 10
    # Stop after the step whose rollouts bring the run's total to this many (0: run num_steps). Samplers spend
    # different numbers of rollouts a step; the ablations compare them at an equal budget of rollouts generated.
    rollout_budget: int = 0
    checkpoint_every: int = 2
    prompts_per_step: int = 8
    updates_per_batch: int = 1  # GRPO's iterations: policy updates on each step's rollouts
    eps_low: float = 0.2
    eps_high: float = 0.28
    kl_coef: float = 0.0  # weight of the KL to the start policy in the loss (0: none, as the paper trains)
    seq_len: int = 2048  # the learner's rows
    rows: int = 64  # the most rows an update packs: a step's chosen rollouts must fit
    micro_rows: int = 8  # rows per micro-batch: an update accumulates gradients over micro-batches of this size
    rows_per: RowsPer = "trajectory"
    # What each turn's prompt shows of the screenshots: -1 the whole conversation as it is (no view),
    # k >= 0 only the last k (the GUI recipe: 1, as the paper trains; 0 for a text-only policy).
    context_images: int = -1
    images_per_row: int = 2  # room for images in each packed row (a vision-language policy's)
    curriculum: CurriculumConfig = field(default_factory=CurriculumConfig)
    # Greedy success on held-out tasks every this many steps (0: never), for curves against step; the
    # policies RL starts from and ends with are its caller's to evaluate, so the last step is skipped.
    eval_every: int = 0
    # Asynchronous RL (orchard.train.pipeline): the rollouts of up to this many later steps are generated while
    # the learner updates, each at most this many weight syncs behind; 0 is the synchronous loop.
    max_staleness: int = 0
    chat_format: str = "qwen3"
    # How the policy is computed (orchard.models.build.ModelSpec's fields; the recipes copy the config's model's).
    dtype: str = "float32"
    param_dtype: str = "float32"
    attention_block: int = ModelSpec.attention_block
    remat: str = ModelSpec.remat
    logits_chunk: int = ModelSpec.logits_chunk
    optim: OptimConfig = field(default_factory=OptimConfig)
    sampler: SamplerConfig = field(default_factory=SamplerConfig)
    engine: EngineConfig = field(default_factory=EngineConfig)
    pass_filter: PassFilterConfig = field(default_factory=PassFilterConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    mesh: MeshConfig = field(default_factory=MeshConfig)


@dataclass
class ScoredRollout:
    """A graded rollout as the group samplers see it."""

    trajectory: Trajectory
    reward: float | None
    status: str
    length: int


def score(trajectory: Trajectory) -> ScoredRollout:
    """The task's reward (``None``: dropped), the run's status and the sampled length."""
    length = sum(len(m.token_ids or ()) for m in trajectory.messages)
    return ScoredRollout(trajectory, trajectory.outcome.reward, trajectory.outcome.status, length)


class RolloutWorkers:
    """Scored rollouts of one policy and harness, seeded by (run seed, step, task, sample index)."""

    def __init__(self, runner: EpisodeRunner, seed: int = 0) -> None:
        self.runner, self.seed = runner, seed

    async def rollouts(self, task: Task, step: int | str, first: int, count: int) -> list[ScoredRollout]:
        """Samples ``first .. first + count - 1`` of ``task`` at ``step``, concurrently."""
        trajectories = await asyncio.gather(*(
            self.runner.run_one(task, episode_seed(self.seed, step, task.id, sample),
                                metadata={"step": step, "sample": sample})
            for sample in range(first, first + count)))
        return [score(t) for t in trajectories]


@dataclass
class StepResult:
    groups: list[GroupResult]
    metrics: dict[str, float]
    final: bool = False  # the run's last step: num_steps reached, or the rollout budget spent


async def gather_groups(workers: RolloutWorkers, sampler: GroupSampler, tasks: Sequence[Task], step: int,
                        spares: Sequence[Task] = (), spent: list[ScoredRollout] | None = None) -> list[GroupResult]:
    """One group per task, sampled concurrently. A task the sampler drops (dynamic filtering: no
    reward variance) is replaced by the next of ``spares``, while they last, as DAPO draws new
    prompts; the dropped groups are returned too, so their rollouts are counted. Every rollout
    generated, chosen or not, is appended to ``spent`` when given."""
    queue = list(spares)

    async def group(task: Task) -> list[GroupResult]:
        results = []
        while True:
            drawn = 0

            async def generate(k: int, task: Task = task) -> list[ScoredRollout]:
                nonlocal drawn
                first, drawn = drawn, drawn + k
                rollouts = await workers.rollouts(task, step, first, k)
                if spent is not None:
                    spent.extend(rollouts)
                return rollouts

            results.append(await sampler.sample(generate))
            if results[-1].group or not queue:
                return results
            task = queue.pop(0)

    per_prompt = await asyncio.gather(*(group(task) for task in tasks))
    return [result for results in per_prompt for result in results]


def group_metrics(groups: Sequence[GroupResult]) -> dict[str, float]:
    """Per-step statistics. ``reward`` is over the training groups (what the update sees, balanced
    by BAR); ``resolve_rate`` is over every rollout spent, chosen or not."""
    rollouts = [r for g in groups for r in g.group]
    rewards = [r.reward for r in rollouts if r.reward is not None]
    chosen = [g for g in groups if g.group]
    return {
        # the groups the update trains on: how many, the share with reward variance, their positive share
        "groups_chosen": float(len(chosen)),
        "informative_chosen": statistics.fmean(g.informative for g in chosen) if chosen else 0.0,
        "positive_fraction": sum(r > 0 for r in rewards) / len(rewards) if rewards else 0.0,
        "reward": statistics.fmean(rewards) if rewards else 0.0,
        "resolve_rate": sum(g.resolved for g in groups) / max(sum(g.spent for g in groups), 1),  # all rollouts
        "informative_groups": statistics.fmean(g.informative for g in groups) if groups else 0.0,
        "rollouts_per_group": statistics.fmean(g.spent for g in groups) if groups else 0.0,
        "fallback_relaxed": float(sum(g.fallback == "relaxed" for g in groups)),
        "fallback_top_ranked": float(sum(g.fallback == "top_ranked" for g in groups)),
        "groups_dropped": float(sum(not g.group for g in groups)),
        "rollouts_dropped": float(sum(g.dropped for g in groups)),
        "rollouts_per_update": sum(g.spent for g in groups) / max(sum(bool(g.group) for g in groups), 1),
        # the chosen rollouts' agent loops: seconds in the policy and in the environment (sandbox, browser)
        "policy_s": sum(r.trajectory.metadata.get("policy_s", 0.0) for r in rollouts),
        "env_s": sum(r.trajectory.metadata.get("env_s", 0.0) for r in rollouts),
    }


@dataclass
class Learner:
    """The trainer's side of a step: rows from groups, the update, and the weight sync.

    With ``start_params`` (the parameters RL started from, never donated), each update batch gets their
    logprobs of its tokens (``ref_logprobs``, one forward pass), from which a train step whose loss reports
    diagnostics measures the KL to the start policy.

    For a vision-language policy (``images``: the store its screenshots are in, and its config), each
    update's rows carry their images (:mod:`orchard.data.vision_rows`, :mod:`orchard.train.images`);
    the step is compiled for the screenshots' size when the first update meets it."""

    graphdef: Any
    make_step: Callable[[Grid | None], Any]  # the train step for images of a grid (None: text only)
    mesh: Any
    engine: RolloutEngine
    chat_format: ChatFormat
    config: RLConfig
    images: tuple[VLMConfig, ImageStore] | None = None
    start_params: Any = None
    final: bool = False  # whether the last update was the run's last (the controller says; followers stop on it)
    _steps: dict = field(default_factory=dict)
    _references: dict = field(default_factory=dict)

    @property
    def view(self) -> ContextView | None:
        return None if self.config.context_images < 0 else latest_images(self.config.context_images)

    def rows(self, groups: Sequence[GroupResult]) -> tuple[dict[str, np.ndarray], Grid | None]:
        """GRPO rows for the chosen groups, each rollout with its group-relative advantage, as
        ``[micro-batches, micro_rows, seq_len]`` arrays (the rows padded to whole micro-batches), and
        the grid of their images (None for text)."""
        table = ImageTable(*self.images) if self.images is not None else None
        examples = []
        for result in groups:
            rewards = [r.reward for r in result.group]
            for rollout, advantage in zip(result.group, group_advantages(rewards), strict=True):
                examples += policy_rows(rollout.trajectory, advantage, self.chat_format, self.config.rows_per,
                                        self.view, table)
        micro = self.config.micro_rows
        inputs = IMAGE_FEATURES if table is not None else ()
        packed = pack_rollouts(examples, self.config.seq_len, self.config.rows, micro, inputs)
        batch = {k: v.reshape(-1, micro, *v.shape[1:]) for k, v in packed.items()}
        if table is None or not table.refs:
            return batch, None
        grid, cfg = table.grid_of_all(), self.images[0].vision
        return attach_images(batch, table.patches, grid, cfg.tokens_for(grid), self.config.images_per_row), grid

    def train_step(self, grid: Grid | None) -> Any:
        if grid not in self._steps:
            self._steps[grid] = self.make_step(grid)
        return self._steps[grid]

    def reference(self, grid: Grid | None) -> Any:
        """The start parameters' target logprobs of an update batch (images of ``grid``)."""
        if grid not in self._references:
            self._references[grid] = make_reference_logprobs(self.graphdef, grid)
        return self._references[grid]

    def sync(self, state: TrainState) -> None:
        """Serve ``state``'s parameters; the weight version is the number of updates. In a learner over
        several processes the controller syncs, and the others take part in its export's gathers. With
        ``max_staleness`` the engine gets a copy: it samples while the next train step donates the state's."""
        copied = self.config.max_staleness and is_controller()
        params = jax.tree.map(jnp.copy, state.params) if copied else state.params
        weights = ModelWeights(self.graphdef, params, version=int(state.step))
        if is_controller():
            self.engine.update_weights(weights)
        else:
            weights.save_pretrained(None)

    def update(self, state: TrainState, groups: Sequence[GroupResult],
               final: bool = False) -> tuple[TrainState, dict[str, float] | None]:
        """``updates_per_batch`` updates on the groups' rows, then the sync. The loss is the first
        update's (at ratio 1); the grad norm and whatever else the step reports (the policy loss's
        diagnostics: :func:`~orchard.train.grpo.policy_diagnostics`) are their means. No groups: no
        update (None).

        In a learner over several processes every process calls it at each step; the controller's groups
        are the step's (its rows go to the others, whose ``groups`` are ignored), and so is ``final``,
        whether this is the run's last update (:attr:`final` on every process after the call)."""
        rows, grid, self.final = broadcast((*(self.rows(groups) if is_controller() and groups else (None, None)),
                                            final))
        if rows is None:
            return state, None
        batch, train_step = global_batch(rows, batch_sharding(self.mesh)), self.train_step(grid)
        if self.start_params is not None:  # one forward pass under the start policy, for all the updates
            batch = {**batch, "ref_logprobs": self.reference(grid)(self.start_params, batch)}
        learner = []
        for _ in range(self.config.updates_per_batch):  # after the first, the ratio moves and the clip bounds it
            state, out = train_step(state, batch)
            learner.append({k: float(v) for k, v in jax.device_get(out).items()})
        self.sync(state)
        means = [k for k in learner[0] if k not in ("loss", "lr", "tokens")]  # the grad norm and the diagnostics
        return state, {"loss": learner[0]["loss"], "lr": learner[0]["lr"], "trained_tokens": learner[0]["tokens"],
                       **{k: statistics.fmean(u[k] for u in learner) for k in means}}


DIAGNOSTICS = ("clip_fraction", "kl_to_behaviour", "sampled_token_entropy", "kl_to_start")


def draw_tasks(tasks: Sequence[Task], count: int, seed: int, step: int) -> tuple[list[Task], list[Task]]:
    """The step's tasks and as many spares (which replace dropped ones), drawn by the one seed formula."""
    drawn = seeded_random(seed, "prompts", step).sample(list(tasks), min(2 * count, len(tasks)))
    return drawn[:count], drawn[count:]


def budget_spent(config: RLConfig, rollouts: int) -> bool:
    """Whether ``rollouts`` generated exhaust the run's rollout budget (never, without one)."""
    return bool(config.rollout_budget) and rollouts >= config.rollout_budget


@dataclass
class Collected:
    """A step's rollouts: its groups (the sampler's, dropped ones included), every rollout generated, and
    the seconds from their launch to the last of them."""

    groups: list[GroupResult]
    generated: list[ScoredRollout]
    rollout_s: float


async def collect_step(step: int, workers: RolloutWorkers, sampler: GroupSampler, tasks: Sequence[Task],
                       config: RLConfig) -> Collected:
    """Step ``step``'s groups: its draw of ``config.prompts_per_step`` tasks (and spares), sampled;
    :class:`~orchard.eval.runner.EnvironmentDown` when every rollout broke outside the policy (the run
    stops at its last checkpoint instead of stepping on without data)."""
    chosen, spares = draw_tasks(tasks, config.prompts_per_step, config.seed, step)
    started, generated = time.perf_counter(), []
    groups = await gather_groups(workers, sampler, chosen, step, spares, generated)
    require_environment([r.trajectory for r in generated], f"rl step {step}")
    return Collected(groups, generated, time.perf_counter() - started)


def learn_step(step: int, state: TrainState, learner: Learner, collected: Collected, spent: int = 0,
               wait_s: float | None = None) -> tuple[TrainState, StepResult]:
    """The update and the weight sync of step ``step`` on its collected rollouts, ``spent`` rollouts into the
    run; returns the new state and the step's metrics (``rollouts``: this step's, dropped ones included;
    ``rollouts_total``: the run's so far; ``wait_s``: how long the learner waited for the rollouts, their
    whole ``rollout_s`` when synchronous). Groups older than ``max_staleness`` syncs are dropped
    (:func:`~orchard.train.pipeline.drop_stale`). The step is the run's last at ``num_steps`` or when the
    rollout budget is spent."""
    config, groups = learner.config, collected.groups
    metrics = group_metrics(groups)
    rollouts = sum(g.spent for g in groups)
    fresh, ages = drop_stale(groups, int(state.step), config.updates_per_batch, config.max_staleness)
    wait_s = collected.rollout_s if wait_s is None else wait_s
    # tampered: this step's rollouts whose grader found the policy manipulating it (the early warning)
    metrics.update({"rollouts": float(rollouts), "rollouts_total": float(spent + rollouts),
                    "tampered": float(sum(r.trajectory.tampered for r in collected.generated)),
                    "rollout_s": collected.rollout_s, "wait_s": wait_s, **ages})
    final = step + 1 >= config.num_steps or budget_spent(config, spent + rollouts)
    started = time.perf_counter()
    state, update = learner.update(state, [g for g in fresh if g.group], final)
    learn_s = time.perf_counter() - started
    if update is None:  # e.g. dynamic filtering dropped every prompt: no update, the same weights
        log.warning("step %d: every group was dropped; no update", step)
        metrics.update({"loss": 0.0, "grad_norm": 0.0, "lr": 0.0, "trained_tokens": 0.0, "learn_s": 0.0,
                        "tokens_per_s": 0.0, **dict.fromkeys(DIAGNOSTICS, 0.0)})
        return state, StepResult(groups, metrics, final)
    metrics.update(update)
    metrics.update({"learn_s": learn_s, "tokens_per_s": update["trained_tokens"] / max(wait_s + learn_s, 1e-9)})
    return state, StepResult(groups, metrics, final)


async def rl_step(step: int, state: TrainState, learner: Learner, workers: RolloutWorkers, sampler: GroupSampler,
                  tasks: Sequence[Task], spent: int = 0) -> tuple[TrainState, StepResult]:
    """Rollouts, the update and the weight sync of step ``step``, synchronously (:func:`collect_step`, then
    :func:`learn_step`)."""
    collected = await collect_step(step, workers, sampler, tasks, learner.config)
    return learn_step(step, state, learner, collected, spent)


async def filter_by_pass_rate(workers: RolloutWorkers, tasks: Sequence[Task], samples: int, low: float,
                              high: float) -> tuple[list[Task], dict[str, float]]:
    """The paper's RL prompt filter: ``samples`` rollouts of every task by the initial policy,
    keeping those whose pass rate ``p`` has ``low < p <= high`` (the paper: 0 < p <= 0.5). A prompt
    the policy always solves or always fails gives groups with no variance, which BAR can only
    meet with its fallbacks. Returns the kept tasks and every task's pass rate (``nan`` when every
    rollout of it was dropped)."""
    rates: dict[str, float] = {}

    async def measure(task: Task) -> None:
        rewards = [r.reward for r in await workers.rollouts(task, "pass_filter", 0, samples) if r.reward is not None]
        rates[task.id] = sum(r > 0 for r in rewards) / len(rewards) if rewards else float("nan")

    with tqdm(total=len(tasks), desc="rl prompts: pass rate", unit="prompt") as bar:
        for done in asyncio.as_completed([measure(task) for task in tasks]):
            await done
            bar.update()
    kept = [t for t in tasks if low < rates[t.id] <= high]
    log.info("pass-rate filter: %d of %d prompts have %g < p <= %g (%d rollouts)", len(kept), len(tasks), low,
             high, samples * len(tasks))
    return kept, rates


async def rl_prompts(config: PassFilterConfig, workdir: str, workers: RolloutWorkers, tasks: Sequence[Task]
                     ) -> list[Task]:
    """RL's prompts: ``tasks``, or with ``config.samples`` those that pass :func:`filter_by_pass_rate`
    under the initial policy (all of them, with a warning, when none does). The choice is saved in
    ``workdir/prompts.json``, so a resumed run keeps it."""
    path = os.path.join(workdir, "prompts.json")
    if os.path.exists(path):
        chosen = set(read_json(path)["prompts"])
        return [t for t in tasks if t.id in chosen]
    kept, rates = list(tasks), {}
    if config.samples:
        kept, rates = await filter_by_pass_rate(workers, tasks, config.samples, config.low, config.high)
        if not kept:
            log.warning("no prompt passed the pass-rate filter; RL samples all %d", len(tasks))
            kept = list(tasks)
    write_json(path, {"prompts": [t.id for t in kept], "pass_rates": rates})
    return kept


def in_process_engine(config: EngineConfig, model: Any, tokenizer: Tokenizer) -> JaxEngine:
    """The in-process engine over ``model`` with ``config``'s prefix cache (RL's ``jax`` engine, and
    evaluation's whatever the kind)."""
    return JaxEngine(model, tokenizer, prefix_cache_bytes=config.prefix_cache_mb << 20)


def make_engine(config: EngineConfig, model: Any, tokenizer: Tokenizer) -> RolloutEngine:
    """The rollout engine ``config`` names (see :class:`EngineConfig`)."""
    if config.kind == "jax":
        return in_process_engine(config, model, tokenizer)
    if config.kind in ("vllm", "openai"):
        replicas = [url.strip() for url in config.url.split(",") if url.strip()]
        return OpenAIEngine(replicas, config.served_model, api_key=config.api_key, weight_sync=make_weight_sync(config))
    raise ValueError(f"unknown rollout engine {config.kind!r}: jax, vllm or openai")


def make_weight_sync(config: EngineConfig) -> WeightSync:
    """The weight sync ``config.weight_sync`` names (see :class:`EngineConfig`)."""
    if config.weight_sync == "disk":
        return ReloadFromDisk(config.weights_dir)
    if config.weight_sync == "nccl":
        from orchard.rollout.openai_engine import served_dtype
        from orchard.rollout.weight_transfer import NcclWeightTransfer

        if not config.nccl_master_address:
            raise ValueError("weight_sync 'nccl' needs nccl_master_address: an address of this host that the "
                             "vLLM workers reach")
        has_config = bool(config.weights_dir) and os.path.isfile(os.path.join(config.weights_dir, "config.json"))
        return NcclWeightTransfer(config.nccl_master_address, config.nccl_master_port,
                                  dtype=served_dtype(config.weights_dir) if has_config else None)
    raise ValueError(f"unknown weight sync {config.weight_sync!r}: disk or nccl")


def make_policy(config: RLConfig, engine: RolloutEngine, chat_format: ChatFormat,
                temperature: float | None = None, images: ImageStore | None = None) -> Policy:
    """The policy RL samples with (and evaluation, at ``temperature``), over ``engine``; its prompts
    show the last ``config.context_images`` screenshots (read from ``images``)."""
    view = None if config.context_images < 0 else latest_images(config.context_images)
    return EnginePolicy(engine, chat_format, config.rollout.sampling(config.seed, temperature),
                        concurrency=1 if config.engine.kind == "jax" else config.rollout.concurrency, view=view,
                        images=images)


async def train_rl(config: RLConfig, workdir: str, client: AsyncSandboxClient, tasks: Sequence[Task],
                   harness: Harness, *, policy: str, tokenizer: str | None = None,
                   inputs: dict[str, str] | None = None, rerun: bool = False,
                   setups: SetupCache | None = None, images: ImageStore | None = None,
                   pool: SandboxPool | None = None,
                   held_out: Mapping[str, Sequence[Task]] | None = None) -> dict[str, float]:
    """Run ``config.num_steps`` RL steps in ``workdir`` from the policy in ``policy`` (an HF
    directory or a ``.gguf``) with the tokenizer in ``tokenizer`` (default: beside the policy);
    return the last step's metrics. The final policy is
    written to ``workdir/model`` (weights and tokenizer). ``workdir`` is a
    :class:`~orchard.workdir.Stage` (``inputs`` are the fingerprints of what made the policy and
    the tasks): a killed run resumes from its checkpoints, a finished one returns its result, and
    one made by another config is an error unless ``rerun``. ``setups`` (default: one of its own)
    forks each rollout from its task's set-up snapshot; ``pool`` keeps sandboxes (browsers) between
    episodes of reusable families. ``images``: the store the harness writes
    screenshots to, for a vision-language policy (its prompts show them; its rows train on them).
    ``config.curriculum`` raises the episodes' step cap from stage to stage as the reward saturates.
    ``held_out`` (named sets of tasks): with ``config.eval_every``, each set's greedy success under the
    full limits is logged as ``held_out_success/<name>`` at those steps (never used to choose anything).

    The rollout engine is ``config.engine`` (:func:`make_engine`): on the embedded default the
    in-process :class:`~orchard.rollout.jax_engine.JaxEngine` over the learner's own parameters, so
    the weight sync after each update is immediate; on clusters a vLLM server.
    """
    lead("rl", config=config, workdir=workdir, client=None, tasks=(), harness=None, policy=policy,
         tokenizer=tokenizer, inputs=inputs, rerun=rerun)
    stage = Stage(workdir, "rl", config, inputs, shared=True)
    if stage.open(rerun) == "done":
        return stage.summary()
    if is_multiprocess() and config.engine.kind == "jax":
        raise ValueError("a learner over several processes samples through a server (engine.kind vllm or openai), "
                         "not the in-process JAX engine")
    mesh = config.mesh.make()
    model = build_model(ModelSpec(path=policy, dtype=config.dtype, param_dtype=config.param_dtype,
                                  attention_block=config.attention_block, remat=config.remat,
                                  logits_chunk=config.logits_chunk), config.seed, mesh=mesh)
    vocabulary = Tokenizer.from_pretrained(tokenizer or policy)
    chat_format = model_chat_format(config.chat_format, vocabulary, model)
    engine = make_engine(config.engine, model, vocabulary)
    vision = (model.config, images) if isinstance(getattr(model, "config", None), VLMConfig) else None
    if vision is not None and images is None:
        raise ValueError("a vision-language policy needs the image store its screenshots are written to")
    optimizer, schedule = make_optimizer(config.optim, config.num_steps * config.updates_per_batch)
    graphdef, state = init_state(model, optimizer, mesh)
    del model
    # The start policy, for the KL to it: a copy of the parameters built from ``policy`` (the train step
    # donates the state's), kept before a resumed run restores its checkpoint.
    start_params = jax.tree.map(jnp.copy, state.params)

    def make_step(grid: Grid | None) -> Any:
        loss = make_policy_loss(config.eps_low, config.eps_high, grid, diagnostics=True, kl_coef=config.kl_coef)
        return make_train_step(graphdef, optimizer, schedule, loss_fn=loss)

    learner = Learner(graphdef, make_step, mesh, engine, chat_format, config, vision, start_params)
    checkpointer = Checkpointer(os.path.join(os.path.abspath(workdir), "checkpoints"), config.checkpoint_every)
    if (latest := checkpointer.latest_step()) is not None:
        state = checkpointer.restore(latest, state)
    learner.sync(state)  # the engine serves the learner's own (sharded) arrays from the first rollout on
    curriculum = config.curriculum.make()
    curriculum_path = os.path.join(workdir, "curriculum.json")
    if curriculum is not None and latest is not None and os.path.exists(curriculum_path):
        curriculum.load_state_dict(read_json(curriculum_path)[str(latest)])
    last: dict[str, float] = {}
    first = int(state.step) // config.updates_per_batch  # the state counts updates
    # Rollouts a resumed run has spent (its last step's total); a run that spent its budget before it was
    # killed has no step left to run, on any process.
    resumed = first and is_controller() and os.path.exists(os.path.join(workdir, "metrics.jsonl"))
    spent = int(read_metrics(workdir).get(first, {}).get("rollouts_total", 0)) if resumed else 0
    if broadcast(budget_spent(config, spent)):
        first = config.num_steps
    if not is_controller():  # the controller runs the episodes; this process takes part in every update
        for step in range(first, config.num_steps):
            state, _ = learner.update(state, [])
            checkpointer.save(step + 1, state, force=learner.final)
            if learner.final:
                break
    else:
        async with contextlib.AsyncExitStack() as stack:
            if (aclose := getattr(engine, "aclose", None)) is not None:  # its pools opened on this loop
                stack.push_async_callback(aclose)
            if setups is None:
                setups = await stack.enter_async_context(SetupCache(client))
            runner = config.rollout.runner(client, harness, make_policy(config, engine, chat_format, images=images),
                                           setups, pool)
            workers = RolloutWorkers(runner, config.seed)
            greedy = config.rollout.runner(client, harness, make_policy(config, engine, chat_format, 0.0, images),
                                           setups, pool)
            sampler = make_sampler(config.sampler)
            tasks = await rl_prompts(config.pass_filter, workdir, workers, tasks)
            curriculum_states = read_json(curriculum_path) if os.path.exists(curriculum_path) else {}
            # Each step's rollouts, launched up to max_staleness steps ahead (orchard.train.pipeline); an
            # asynchronous run updates in a thread, so that the event loop keeps driving the later steps' episodes.
            pipeline = await stack.enter_async_context(RolloutPipeline(
                lambda step: collect_step(step, workers, sampler, tasks, config), config.max_staleness,
                config.num_steps))

            async def learn(*args: Any) -> tuple[TrainState, StepResult]:
                return await asyncio.to_thread(learn_step, *args) if config.max_staleness else learn_step(*args)

            with MetricsWriter(workdir) as metrics, tqdm(total=config.num_steps, initial=first, desc="rl",
                                                         unit="step") as bar:
                for step in range(first, config.num_steps):
                    if curriculum is not None:  # the limits of the episodes launched from here on
                        runner.limits = curriculum.limits(config.rollout.limits)
                    started = time.perf_counter()
                    collected = await pipeline.take(step)
                    state, result = await learn(step, state, learner, collected, spent, time.perf_counter() - started)
                    last = result.metrics
                    spent = int(last["rollouts_total"])
                    if curriculum is not None:
                        last.update(max_turns=float(runner.limits.max_turns), curriculum_stage=float(curriculum.stage))
                        curriculum.observe(last["reward"])
                        curriculum_states[str(step + 1)] = curriculum.state_dict()
                        write_json(curriculum_path, curriculum_states)
                    if held_out and config.eval_every and (step + 1) % config.eval_every == 0 and not result.final:
                        for name, held_tasks in held_out.items():
                            evaluation = await evaluate_policy(greedy, held_tasks, seed=config.seed,
                                                               name=f"rl held-out {name}", progress=False)
                            last[f"held_out_success/{name}"] = evaluation.metrics()["resolve_rate"]
                    metrics.write(step + 1, last)
                    checkpointer.save(step + 1, state, force=result.final)
                    bar.set_postfix(reward=f"{last['reward']:.2f}", informative=f"{last['informative_groups']:.2f}",
                                    clip=f"{last['clip_fraction']:.3f}", kl_start=f"{last['kl_to_start']:.4f}",
                                    entropy=f"{last['sampled_token_entropy']:.2f}", rollouts=spent,
                                    **({"stale": f"{last['staleness_mean']:.2f}"} if config.max_staleness else {}),
                                    refresh=False)
                    bar.update()
                    if result.final:
                        break
    checkpointer.close()
    export = os.path.join(workdir, "model")
    ModelWeights(graphdef, state.params).save_pretrained(export)
    if is_controller():
        vocabulary.save_pretrained(export)
    stage.finish(last)
    return last
