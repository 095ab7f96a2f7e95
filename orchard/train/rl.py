"""The RL loop: rollouts in sandboxes, training groups from a group sampler, a GRPO update, a weight sync.

Each step draws ``prompts_per_step`` task instances. For each, the group sampler
(:mod:`orchard.train.bar`: BAR, fixed-N GRPO or dynamic filtering) asks for rollouts ``k`` at a
time; a rollout is one graded episode (:func:`orchard.tasks.swe.collect.collect_one`: a fresh
sandbox, the harness driven by the policy, SWE-bench grading, the sandbox always deleted), run
concurrently up to ``concurrency`` sandboxes. The reward is +1 when the patch resolves the task and
-1 otherwise; a rollout that failed for reasons outside the policy (the engine or the sandbox
raised) has no reward and is dropped. The chosen groups become GRPO rows
(:mod:`orchard.train.rollouts`) for one update of the shared train step with the clipped policy
loss (:mod:`orchard.train.grpo`), and the new weights go to the engine before the next step's
rollouts (immediate for :class:`~orchard.rollout.jax_engine.JaxEngine`; ``OpenAIEngine`` and vLLM
through their weight-sync hook).

Before the first step, ``rl.pass_filter`` can keep only the prompts whose pass rate under the
initial policy lies in a window (:func:`filter_by_pass_rate`), as the paper's RL set does.

Metrics per step: reward, resolve rate, informative-group fraction, rollouts per group, fallbacks,
tokens per second, and the time split between rollouts and learning.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import random
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import jax
import numpy as np
from flax import nnx
from tqdm.auto import tqdm

from orchard.data.chat import ChatMLFormat, Qwen3Format
from orchard.data.tokenizer import Tokenizer
from orchard.data.trajectory import Outcome, Trajectory
from orchard.env.client import AsyncSandboxClient
from orchard.harness.core import Harness, Limits, Policy
from orchard.harness.policies import EnginePolicy
from orchard.models.sharding import make_mesh
from orchard.models.shipped import resolve
from orchard.models.weights import save_pretrained
from orchard.rollout.engine import RolloutEngine
from orchard.rollout.jax_engine import JaxEngine
from orchard.rollout.openai_engine import OpenAIEngine, ReloadFromDisk
from orchard.rollout.sampler import SamplingParams
from orchard.tasks.swe.collect import collect_one
from orchard.tasks.swe.instance import SWEInstance
from orchard.train.bar import BAR, DynamicFilter, FixedGroup, GroupResult, GroupSampler
from orchard.train.checkpoint import Checkpointer
from orchard.train.grpo import group_advantages, make_policy_loss
from orchard.train.metrics import MetricsWriter
from orchard.train.rollouts import pack_rollouts, policy_example
from orchard.train.sft import build_model
from orchard.train.state import TrainState, batch_sharding, init_state, make_optimizer, make_train_step

INFRASTRUCTURE = {"policy_error", "sandbox_error"}
log = logging.getLogger(__name__)


@dataclass
class ScoredRollout:
    """A graded rollout as the group samplers see it."""

    trajectory: Trajectory
    reward: float | None
    status: str
    length: int


def score(trajectory: Trajectory) -> ScoredRollout:
    """+1 resolved, -1 not; ``None`` when the episode failed outside the policy's control."""
    failed = trajectory.metadata.get("end_reason") in INFRASTRUCTURE
    reward = None if failed else (1.0 if trajectory.outcome.resolved else -1.0)
    length = sum(len(m.token_ids or ()) for m in trajectory.messages)
    return ScoredRollout(trajectory, reward, trajectory.outcome.status, length)


class RolloutWorkers:
    """Graded episodes of one policy and harness, at most ``concurrency`` sandboxes at a time.

    A rollout never raises. The agent's own wall clock is ``limits.time_limit`` (running out is the
    policy's failure: reward -1). The whole rollout, with sandbox set-up and grading, gets
    ``rollout_seconds``; past it, or when the sandbox or the grader fails, the rollout comes back
    with reward ``None`` (dropped) and ``end_reason`` ``sandbox_error``. The sandbox is deleted in
    every case (:func:`~orchard.harness.episode.run_episode`).
    """

    def __init__(self, client: AsyncSandboxClient, harness: Harness, policy: Policy, limits: Limits,
                 concurrency: int, rollout_seconds: float | None = None) -> None:
        self.client, self.harness, self.policy, self.limits = client, harness, policy, limits
        self.gate = asyncio.Semaphore(concurrency)
        self.rollout_seconds = rollout_seconds
        self.spent = 0

    async def rollouts(self, instance: SWEInstance, count: int, seed: int) -> list[ScoredRollout]:
        async def one(index: int) -> ScoredRollout:
            async with self.gate:
                try:
                    async with asyncio.timeout(self.rollout_seconds):
                        trajectory = await collect_one(self.client, instance, self.harness, self.policy,
                                                       self.limits, seed=seed + index)
                except Exception as exc:  # TimeoutError included: infrastructure, not the policy
                    log.warning("rollout %s/%d failed: %s: %s", instance.instance_id, seed + index,
                                type(exc).__name__, exc)
                    trajectory = Trajectory(task_id=instance.instance_id, policy=self.policy.name,
                                            harness=self.harness.name, messages=[],
                                            outcome=Outcome(status="aborted"),
                                            metadata={"end_reason": "sandbox_error", "seed": seed + index,
                                                      "error": f"{type(exc).__name__}: {exc}"})
            return score(trajectory)

        start, self.spent = self.spent, self.spent + count
        return list(await asyncio.gather(*(one(start + i) for i in range(count))))


@dataclass
class StepResult:
    groups: list[GroupResult]
    metrics: dict[str, float]


async def gather_groups(workers: RolloutWorkers, sampler: GroupSampler, instances: Sequence[SWEInstance],
                        step_seed: int, spares: Sequence[SWEInstance] = ()) -> list[GroupResult]:
    """One group per instance, sampled concurrently. A prompt the sampler drops (dynamic
    filtering: no reward variance) is replaced by the next of ``spares``, while they last, as DAPO
    draws new prompts; the dropped groups are returned too, so their rollouts are counted."""
    queue = list(spares)

    async def group(index: int, instance: SWEInstance) -> list[GroupResult]:
        results = []
        while True:
            seed = step_seed * 100_000 + index * 1000 + len(results) * 100
            results.append(await sampler.sample(lambda k, inst=instance, seed=seed: workers.rollouts(inst, k, seed)))
            if results[-1].group or not queue:
                return results
            instance = queue.pop(0)

    per_prompt = await asyncio.gather(*(group(i, inst) for i, inst in enumerate(instances)))
    return [result for results in per_prompt for result in results]


def group_metrics(groups: Sequence[GroupResult]) -> dict[str, float]:
    """Per-step statistics. ``reward`` is over the training groups (what the update sees, balanced
    by BAR); ``resolve_rate`` is over every rollout spent, chosen or not."""
    rollouts = [r for g in groups for r in g.group]
    rewards = [r.reward for r in rollouts if r.reward is not None]
    return {
        "reward": statistics.fmean(rewards) if rewards else 0.0,
        "resolve_rate": sum(g.resolved for g in groups) / max(sum(g.spent for g in groups), 1),  # all rollouts
        "informative_groups": statistics.fmean(g.informative for g in groups) if groups else 0.0,
        "rollouts_per_group": statistics.fmean(g.spent for g in groups) if groups else 0.0,
        "fallback_relaxed": float(sum(g.fallback == "relaxed" for g in groups)),
        "fallback_top_ranked": float(sum(g.fallback == "top_ranked" for g in groups)),
        "groups_dropped": float(sum(not g.group for g in groups)),
        "rollouts_per_update": sum(g.spent for g in groups) / max(sum(bool(g.group) for g in groups), 1),
    }


def policy_rows(groups: Sequence[GroupResult], chat_format: ChatMLFormat, seq_len: int, rows: int
                ) -> dict[str, np.ndarray]:
    """GRPO rows for the chosen groups: each rollout with its group-relative advantage."""
    examples = []
    for result in groups:
        for rollout, advantage in zip(result.group, group_advantages([r.reward for r in result.group]), strict=True):
            examples.append(policy_example(rollout.trajectory, advantage, chat_format))
    return pack_rollouts(examples, seq_len, rows)


async def rl_step(step: int, state: TrainState, train_step: Any, graphdef: Any, engine: RolloutEngine,
                  workers: RolloutWorkers, sampler: GroupSampler, instances: Sequence[SWEInstance],
                  chat_format: ChatMLFormat, mesh: Any, *, prompts_per_step: int, seq_len: int, rows: int,
                  seed: int, updates: int = 1) -> tuple[TrainState, StepResult]:
    """Rollouts, ``updates`` GRPO updates on them and the weight sync; returns the new state and the
    step's metrics (the loss is the first update's, at ratio 1; the grad norm is their mean)."""
    drawn = random.Random(seed * 1_000_003 + step).sample(list(instances), min(2 * prompts_per_step, len(instances)))
    chosen, spares = drawn[:prompts_per_step], drawn[prompts_per_step:]  # spares replace dropped prompts
    started = time.perf_counter()
    groups = await gather_groups(workers, sampler, chosen, seed * 1000 + step, spares)
    rollout_s = time.perf_counter() - started
    metrics = group_metrics(groups)
    trained = [g for g in groups if g.group]
    if not trained:  # e.g. dynamic filtering dropped every prompt: no update, the same weights
        log.warning("step %d: every group was dropped; no update", step)
        metrics.update({"loss": 0.0, "grad_norm": 0.0, "lr": 0.0, "trained_tokens": 0.0, "rollout_s": rollout_s,
                        "learn_s": 0.0, "tokens_per_s": 0.0})
        return state, StepResult(groups, metrics)
    packed = policy_rows(trained, chat_format, seq_len, rows)
    started = time.perf_counter()
    batch = jax.device_put({k: v[None] for k, v in packed.items()}, batch_sharding(mesh))
    learner = []
    for _ in range(updates):  # after the first, the ratio to the rollouts' logprobs moves and the clip bounds it
        state, out = train_step(state, batch)
        learner.append({k: float(v) for k, v in jax.device_get(out).items()})
    engine.update_weights(nnx.merge(graphdef, state.params))
    learn_s = time.perf_counter() - started
    tokens = learner[0]["tokens"]  # the batch's loss-mask count, the same for every update
    metrics.update({"loss": learner[0]["loss"], "grad_norm": statistics.fmean(u["grad_norm"] for u in learner),
                    "lr": learner[0]["lr"], "trained_tokens": tokens, "rollout_s": rollout_s, "learn_s": learn_s,
                    "tokens_per_s": tokens / max(rollout_s + learn_s, 1e-9)})
    return state, StepResult(groups, metrics)


async def filter_by_pass_rate(workers: RolloutWorkers, instances: Sequence[SWEInstance], samples: int,
                              low: float, high: float, seed: int) -> tuple[list[SWEInstance], dict[str, float]]:
    """The paper's RL prompt filter: ``samples`` rollouts of every instance by the initial policy,
    keeping those whose pass rate ``p`` has ``low < p <= high`` (the paper: 0 < p <= 0.5). A prompt
    the policy always solves or always fails gives groups with no variance, which BAR can only
    meet with its fallbacks. Returns the kept instances and every instance's pass rate (``nan``
    when every rollout of it was dropped)."""
    rates: dict[str, float] = {}

    async def measure(index: int, instance: SWEInstance) -> None:
        rewards = [r.reward for r in await workers.rollouts(instance, samples, seed + index * 1000)
                   if r.reward is not None]
        rates[instance.instance_id] = sum(r > 0 for r in rewards) / len(rewards) if rewards else float("nan")

    with tqdm(total=len(instances), desc="rl prompts: pass rate", unit="prompt") as bar:
        for done in asyncio.as_completed([measure(i, inst) for i, inst in enumerate(instances)]):
            await done
            bar.update()
    kept = [i for i in instances if low < rates[i.instance_id] <= high]
    log.info("pass-rate filter: %d of %d prompts have %g < p <= %g (%d rollouts)", len(kept), len(instances), low,
             high, samples * len(instances))
    return kept, rates


async def rl_prompts(config: Any, workdir: str, workers: RolloutWorkers, instances: Sequence[SWEInstance]
                     ) -> list[SWEInstance]:
    """RL's prompts: ``instances``, or with ``rl.pass_filter.samples`` those that pass
    :func:`filter_by_pass_rate` under the initial policy (all of them, with a warning, when none
    does). The choice is saved in ``workdir/prompts.json``, so a resumed run keeps it."""
    path = os.path.join(workdir, "prompts.json")
    if os.path.exists(path):
        with open(path) as handle:
            chosen = set(json.load(handle)["prompts"])
        return [i for i in instances if i.instance_id in chosen]
    kept, rates = list(instances), {}
    if (spec := config.rl.pass_filter).samples:
        kept, rates = await filter_by_pass_rate(workers, instances, spec.samples, spec.low, spec.high, config.seed)
        if not kept:
            log.warning("no prompt passed the pass-rate filter; RL samples all %d", len(instances))
            kept = list(instances)
    os.makedirs(workdir, exist_ok=True)
    with open(path, "w") as handle:
        json.dump({"prompts": [i.instance_id for i in kept], "pass_rates": rates}, handle, indent=1)
    return kept


def make_engine(config: Any, model: Any, tokenizer: Tokenizer) -> RolloutEngine:
    """The rollout engine a config names: ``jax`` (in process, over the learner's own model) or
    ``vllm`` / ``openai`` (a server at ``url`` serving ``served_model``, whose weights are synced by
    writing safetensors to ``weights_dir``, the directory it serves, and asking it to reload)."""
    if config.kind == "jax":
        return JaxEngine(model, tokenizer)
    if config.kind in ("vllm", "openai"):
        return OpenAIEngine(config.url, config.served_model, api_key=config.get("api_key", "EMPTY"),
                            weight_sync=ReloadFromDisk(config.weights_dir))
    raise ValueError(f"unknown rollout engine {config.kind!r}: jax, vllm or openai")


def make_sampler(config: Any) -> GroupSampler:
    """The group sampler a config names: ``bar`` (the paper's), ``fixed`` (GRPO) or ``dynamic`` (DAPO)."""
    if config.name == "bar":
        return BAR(config.group_size, config.max_budget, config.stride, config.rho_min, config.rho_max)
    if config.name == "fixed":
        return FixedGroup(config.group_size)
    if config.name == "dynamic":
        return DynamicFilter(config.group_size)
    raise ValueError(f"unknown group sampler {config.name!r}: bar, fixed or dynamic")


async def train_rl(config: Any, workdir: str, client: AsyncSandboxClient, instances: Sequence[SWEInstance],
                   harness: Harness, export_dir: str | None = None) -> dict[str, float]:
    """Run ``config.num_steps`` RL steps in ``workdir`` (resuming from its checkpoints); return the
    last step's metrics. With ``export_dir``, the final policy is written there as an HF directory.

    The rollout engine is ``config.engine`` (:func:`make_engine`): on the embedded default the
    in-process :class:`~orchard.rollout.jax_engine.JaxEngine` over the learner's own parameters, so
    the weight sync after each update is immediate; on clusters a vLLM server.
    """
    rl = config.rl
    mesh = make_mesh(config.mesh.fsdp, config.mesh.tp)
    model = build_model(config.model, config.seed)
    tokenizer = Tokenizer.from_pretrained(resolve(config.tokenizer.path))
    chat = Qwen3Format(tokenizer)
    engine = make_engine(config.engine, model, tokenizer)
    policy = EnginePolicy(engine, chat, SamplingParams(max_tokens=rl.max_new_tokens, temperature=rl.temperature,
                                                       seed=config.seed),
                          concurrency=1 if config.engine.kind == "jax" else rl.concurrency)
    optimizer, schedule = make_optimizer(config.optim.peak_lr, config.optim.final_lr, config.optim.warmup_steps,
                                         config.num_steps * rl.updates_per_batch, config.optim.weight_decay,
                                         config.optim.clip_norm)
    graphdef, state = init_state(model, optimizer, mesh)
    checkpointer = Checkpointer(os.path.join(os.path.abspath(workdir), "checkpoints"), config.checkpoint_every)
    if (latest := checkpointer.latest_step()) is not None:
        state = checkpointer.restore(latest, state)
        engine.update_weights(nnx.merge(graphdef, state.params))
    train_step = make_train_step(graphdef, optimizer, schedule, loss_fn=make_policy_loss(rl.eps_low, rl.eps_high))
    limits = Limits(max_steps=rl.max_turns, max_tokens=rl.max_context, time_limit=rl.episode_seconds)
    workers = RolloutWorkers(client, harness, policy, limits, rl.concurrency,
                             rollout_seconds=rl.episode_seconds * 2)
    sampler = make_sampler(rl.sampler)
    instances = await rl_prompts(config, workdir, workers, instances)
    last: dict[str, float] = {}
    first = int(state.step) // rl.updates_per_batch  # the state counts updates
    with MetricsWriter(workdir) as metrics, tqdm(total=config.num_steps, initial=first, desc="rl", unit="step") as bar:
        for step in range(first, config.num_steps):
            state, result = await rl_step(step, state, train_step, graphdef, engine, workers, sampler, instances,
                                          chat, mesh, prompts_per_step=rl.prompts_per_step, seq_len=rl.seq_len,
                                          rows=rl.rows, seed=config.seed, updates=rl.updates_per_batch)
            last = result.metrics
            metrics.write(step + 1, last)
            checkpointer.save(step + 1, state, force=step + 1 == config.num_steps)
            bar.set_postfix(reward=f"{last['reward']:.2f}", informative=f"{last['informative_groups']:.2f}",
                            refresh=False)
            bar.update()
    checkpointer.close()
    if export_dir:
        save_pretrained(nnx.merge(graphdef, state.params), export_dir)
    return last


async def evaluate(workers: RolloutWorkers, instances: Sequence[SWEInstance], samples: int = 1,
                   seed: int = 0) -> tuple[dict[str, float], list[Trajectory]]:
    """Held-out resolve rate of the workers' policy over ``samples`` graded episodes per instance,
    and those episodes, so a failure can be read."""
    runs = await asyncio.gather(*(workers.rollouts(instance, samples, seed=seed * 1000 + index * samples)
                                  for index, instance in enumerate(instances)))
    rollouts = [r for per_instance in runs for r in per_instance]
    solved = [r.trajectory.outcome.resolved for r in rollouts]
    stats = {"resolve_rate": statistics.fmean(solved) if solved else 0.0, "episodes": float(len(rollouts)),
             "tasks_solved": float(sum(any(r.trajectory.outcome.resolved for r in per) for per in runs)),
             "turns": statistics.fmean(r.trajectory.num_actions for r in rollouts) if rollouts else 0.0}
    return stats, [r.trajectory for r in rollouts]
