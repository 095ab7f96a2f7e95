"""The RL loop over Tasks: rollouts in real sandboxes, groups, a GRPO update, the weight sync, seeds, resume."""

from __future__ import annotations

import asyncio
import functools
import os
from types import SimpleNamespace

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from orchard.config import from_config, to_dict
from orchard.data.chat import smollm2_format
from orchard.data.tokenizer import Tokenizer
from orchard.data.trajectory import Message, Outcome, Trajectory
from orchard.eval.runner import RolloutConfig
from orchard.harness.bash import BashHarness
from orchard.harness.core import Limits, Turn
from orchard.harness.episode import EpisodeRunner
from orchard.harness.policies import EnginePolicy
from orchard.models import ModelConfig, Transformer, save_pretrained
from orchard.models.sharding import make_mesh
from orchard.models.shipped import smollm2_gguf
from orchard.rollout.types import SamplingParams
from orchard.tasks.swe.generate import generate_task_set
from orchard.tasks.swe.sources import resolve_source
from orchard.tasks.swe.task import swe_tasks
from orchard.train.bar import BAR, DynamicFilter, FixedGroup
from orchard.train.grpo import make_policy_loss, make_reference_logprobs
from orchard.train.rl import (
    EngineConfig,
    Learner,
    PassFilterConfig,
    RLConfig,
    RolloutWorkers,
    ScoredRollout,
    filter_by_pass_rate,
    gather_groups,
    group_metrics,
    make_engine,
    rl_prompts,
    rl_step,
)
from orchard.train.state import OptimConfig, init_state, make_optimizer, make_train_step

STEP = {"seq_len": 1280, "rows": 4, "micro_rows": 4}  # one learner shape for every test: one compiled step

TINY = {"hidden_size": 32, "intermediate_size": 64, "num_heads": 4, "num_kv_heads": 2, "head_dim": 8,
        "max_position_embeddings": 4096, "dtype": "float32"}


@pytest.fixture(scope="module")
def smollm2_tokenizer() -> Tokenizer:
    return Tokenizer.from_gguf(smollm2_gguf())  # a 49K vocabulary keeps the learner's logits small


@functools.cache
def _compiled(num_layers: int):
    """One jitted GRPO step per model shape, shared by the tests (each builds its own fresh state)."""
    model = Transformer(ModelConfig.tiny(49152, num_layers=num_layers, **TINY), rngs=nnx.Rngs(0))
    optimizer, schedule = make_optimizer(OptimConfig(1e-3, 1e-4, 1), 10)
    graphdef, _ = nnx.split(model, nnx.Param)
    return optimizer, make_train_step(graphdef, optimizer, schedule, loss_fn=make_policy_loss())


def tiny_learner(tokenizer: Tokenizer, num_layers: int, config: RLConfig, prefix_cache_mb: int = 0):
    """A fresh tiny random policy over SmolLM2's vocabulary (the same weights every call), its engine
    (with a prefix cache of ``prefix_cache_mb``) and a Learner of its GRPO step."""
    model = Transformer(ModelConfig.tiny(49152, num_layers=num_layers, **TINY), rngs=nnx.Rngs(0))
    chat = smollm2_format(tokenizer)
    engine = make_engine(EngineConfig(prefix_cache_mb=prefix_cache_mb), model, tokenizer)
    policy = EnginePolicy(engine, chat, SamplingParams(max_tokens=16, temperature=1.0))
    mesh = make_mesh(1, 1)
    optimizer, train_step = _compiled(num_layers)
    graphdef, state = init_state(model, optimizer, mesh)
    return policy, state, Learner(graphdef, lambda grid: train_step, mesh, engine, chat, config)


@pytest.fixture(scope="module")
def minicalc(tmp_path_factory):
    instances, _ = generate_task_set([resolve_source("minicalc")], 2, str(tmp_path_factory.mktemp("tasks")), seed=2,
                                     tests_visible=True)
    return swe_tasks(instances)


def _workers(client, policy, concurrency: int, max_turns: int = 2, **options) -> RolloutWorkers:
    return RolloutWorkers(EpisodeRunner(client, BashHarness(), policy, concurrency=concurrency,
                                        limits=Limits(max_turns=max_turns), **options), seed=0)


@pytest.mark.slow
def test_one_rl_step_in_real_sandboxes(orchestrator, minicalc, smollm2_tokenizer):
    config = RLConfig(prompts_per_step=1, **STEP)
    policy, state, learner = tiny_learner(smollm2_tokenizer, 2, config)

    async def run():
        async with orchestrator.async_client() as client:
            workers = _workers(client, policy, concurrency=2)
            result = await rl_step(0, state, learner, workers, BAR(2, 4, 2), minicalc[:1])
            return result, {info.id for info in await client.list()}

    (new_state, step), alive = asyncio.run(run())
    [group] = step.groups
    assert group.spent == 4  # a random policy never resolves: BAR spends its budget, then relaxes
    assert group.fallback == "relaxed" and len(group.group) == 2 and not group.informative
    assert step.metrics["resolve_rate"] == 0.0 and step.metrics["reward"] == -1.0
    assert step.metrics["fallback_relaxed"] == 1.0 and step.metrics["informative_groups"] == 0.0
    assert step.metrics["trained_tokens"] > 0 and step.metrics["loss"] == pytest.approx(0.0, abs=1e-6)  # no variance
    assert not {r.trajectory.metadata["sandbox_id"] for r in group.group} & alive
    for rollout in group.group:
        assert rollout.trajectory.metadata["step"] == 0 and rollout.trajectory.metadata["sample"] in range(4)
        for message in (m for m in rollout.trajectory.messages if m.role == "assistant"):
            assert message.token_ids and message.logprobs and message.prompt_digest and message.weight_version == 0
    served = jax.tree.leaves(learner.engine.sampler.state)  # the engine serves the learner's new parameters
    learned = jax.tree.leaves(new_state.params)
    assert all(np.array_equal(np.asarray(a), np.asarray(b)) for a, b in zip(served, learned, strict=True))
    assert learner.engine.weight_version == 1 == int(new_state.step)


@pytest.mark.slow
def test_a_rerun_samples_the_same_rollouts_at_any_concurrency(orchestrator, minicalc, smollm2_tokenizer):
    """Episode seeds depend on (run seed, step, task, sample), not on the order episodes finish in; and the
    prefix cache, which the episodes' turns fill and read interleaved, changes no token."""
    config = RLConfig(prompts_per_step=2, **STEP)
    runs = []
    for concurrency, prefix_cache_mb in ((1, 0), (3, 64)):
        policy, state, learner = tiny_learner(smollm2_tokenizer, 1, config, prefix_cache_mb)

        async def run(policy=policy, state=state, learner=learner, concurrency=concurrency):
            async with orchestrator.async_client() as client:
                return await rl_step(3, state, learner, _workers(client, policy, concurrency), FixedGroup(2), minicalc)

        new_state, step = asyncio.run(run())
        rollouts = {(r.trajectory.task_id, r.trajectory.metadata["sample"]): r for g in step.groups for r in g.group}
        runs.append((new_state, rollouts, learner.engine.sampler.prefix_cache))
    (first_state, first, _), *others = runs
    assert len(first) == 4
    for other_state, other, _ in others:
        assert first.keys() == other.keys()
        for key, rollout in first.items():
            sampled = [m.token_ids for m in rollout.trajectory.messages if m.role == "assistant"]
            assert sampled == [m.token_ids for m in other[key].trajectory.messages if m.role == "assistant"], key
            assert rollout.trajectory.metadata["seed"] == other[key].trajectory.metadata["seed"]
        for a, b in zip(jax.tree.leaves(first_state.params), jax.tree.leaves(other_state.params), strict=True):
            np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-7)
    cache = runs[-1][2]
    assert cache.stats.hits > 0 and not cache.entries  # the episodes' later turns hit; the update dropped them


def test_an_rl_step_with_reward_variance_changes_the_parameters_and_syncs_them(orchestrator, minicalc,
                                                                                smollm2_tokenizer):
    """A random tiny policy never resolves a task, so this sampler marks the first rollout of each
    group resolved: the group has variance and the updates are not zero."""

    class FirstResolves(FixedGroup):
        async def sample(self, generate):
            async def marked(k):
                rollouts = await generate(k)
                rollouts[0].reward = 1.0
                return rollouts

            return await super().sample(marked)

    config = RLConfig(prompts_per_step=1, updates_per_batch=2, **STEP)
    policy, state, learner = tiny_learner(smollm2_tokenizer, 1, config)
    before = [np.asarray(x).copy() for x in jax.tree.leaves(state.params)]

    async def run():
        async with orchestrator.async_client() as client:
            return await rl_step(1, state, learner, _workers(client, policy, 2, max_turns=1), FirstResolves(2),
                                 minicalc[:1])

    new_state, step = asyncio.run(run())
    # Not the loss: at ratio one it is -(sum of advantage x tokens) / tokens, exactly 0 when the group's
    # two rollouts (advantages +a and -a) have as many tokens each; its gradient is not.
    assert step.metrics["informative_groups"] == 1.0 and step.metrics["grad_norm"] > 0, step.metrics
    assert step.metrics["tampered"] == 0.0  # minicalc's oracle-free rollouts: nothing for the grader to flag
    assert int(new_state.step) == 2  # GRPO's iterations: two updates on the step's rollouts
    after = [np.asarray(x) for x in jax.tree.leaves(new_state.params)]
    assert any(not np.array_equal(a, b) for a, b in zip(before, after, strict=True))  # the update moved them
    served = [np.asarray(x) for x in jax.tree.leaves(learner.engine.sampler.state)]
    assert all(np.array_equal(a, b) for a, b in zip(served, after, strict=True))  # and the engine has them


class _Scripted:
    """A policy that runs ``on_act`` before answering with one harmless command."""

    name = "scripted"

    def __init__(self, on_act) -> None:
        self.on_act = on_act

    async def act(self, conversation, *, max_context=None):
        await self.on_act()
        return Turn(Message(role="assistant", content="THOUGHT: look.\n\n```bash\nls\n```"))


def test_rollouts_broken_outside_the_policy_or_out_of_time_are_dropped(orchestrator, minicalc):
    """A sandbox that dies under its episode, an agent loop out of wall clock and an episode out of
    its whole budget all come back with reward None (dropped), and every sandbox is deleted."""
    [task] = minicalc[:1]

    async def run():
        async with orchestrator.async_client() as client:
            before = {info.id for info in await client.list()}

            async def kill_my_sandbox():  # the sandbox disappears under the running episode
                for info in await client.list():
                    if info.id not in before:
                        await client.delete(info.id)

            async def hang():
                await asyncio.sleep(30)

            runners = [EpisodeRunner(client, BashHarness(), _Scripted(kill_my_sandbox), limits=Limits(max_turns=3)),
                       EpisodeRunner(client, BashHarness(), _Scripted(hang), limits=Limits(max_turns=3, time_limit=1.0)),
                       EpisodeRunner(client, BashHarness(), _Scripted(hang), limits=Limits(max_turns=3),
                                     episode_seconds=3.0)]
            results = [await RolloutWorkers(runner).rollouts(task, 0, 0, 1) for runner in runners]
            return results, {info.id for info in await client.list()} - before

    ([dead], [timed_out], [stuck]), leftover = asyncio.run(run())
    assert dead.reward is None and dead.trajectory.metadata["end_reason"] == "sandbox_error"
    assert timed_out.reward is None and timed_out.status == "timed_out"  # excluded from training, as in the paper
    assert "grade" not in timed_out.trajectory.metadata  # and never graded
    assert stuck.reward is None and "TimeoutError" in stuck.trajectory.metadata["error"]  # the episode's budget
    assert leftover == set()  # every sandbox deleted


@pytest.mark.slow
def test_train_rl_resumes_a_killed_run_and_refuses_a_changed_config(orchestrator, minicalc, smollm2_tokenizer,
                                                                    tmp_path, monkeypatch):
    from orchard.train import rl
    from orchard.train.metrics import read_metrics
    from orchard.workdir import StaleStage

    policy_dir = str(tmp_path / "policy")
    save_pretrained(Transformer(ModelConfig.tiny(49152, num_layers=1, **TINY), rngs=nnx.Rngs(0)), policy_dir)
    smollm2_tokenizer.save_pretrained(policy_dir)
    # at most 4 steps, but a budget of 4 rollouts (2 a step) ends it at step 2, counted across the kill; asynchronous:
    # a step's update runs while the next step's rollouts do (the last run's step 3, launched, is cancelled)
    config = from_config(RLConfig, {"num_steps": 4, "rollout_budget": 4, "checkpoint_every": 1,
                                    "prompts_per_step": 1, **STEP, "max_staleness": 1,
                                    "updates_per_batch": 2, "chat_format": "smollm2",
                                    "sampler": {"name": "fixed", "group_size": 2},
                                    "rollout": {"max_new_tokens": 16, "max_turns": 2, "max_context": 1200}})
    workdir = str(tmp_path / "rl")
    make_sampler, samples = rl.make_sampler, []

    class Killed(Exception):
        pass

    def dies_at_step_two(sampler_config):
        sampler = make_sampler(sampler_config)

        class Dying:
            async def sample(self, generate):
                samples.append(1)
                if len(samples) == 2:
                    raise Killed("the job was killed")
                return await sampler.sample(generate)

        return Dying()

    async def run(configuration):
        async with orchestrator.async_client() as client:
            return await rl.train_rl(configuration, workdir, client, minicalc[:1], BashHarness(), policy=policy_dir)

    monkeypatch.setattr(rl, "make_sampler", dies_at_step_two)
    with pytest.raises(Killed):
        asyncio.run(run(config))
    assert sorted(read_metrics(workdir)) == [1]
    asyncio.run(run(config))  # resumes after step 1: step 2 only
    metrics = read_metrics(workdir)
    with open(os.path.join(workdir, "metrics.jsonl")) as handle:
        assert sorted(metrics) == [1, 2] and len(handle.readlines()) == 2  # step 1 ran once
    assert all(metrics[s]["rollouts_per_group"] == 2 and metrics[s]["reward"] == -1.0 for s in metrics)
    assert [metrics[s]["rollouts_total"] for s in (1, 2)] == [2, 4]  # the resumed run counted step 1's rollouts
    assert {"informative_groups", "fallback_relaxed", "rollout_s", "wait_s", "learn_s", "rollouts_dropped"} <= set(
        metrics[2])
    assert all(metrics[s]["stale_dropped"] == 0 and metrics[s]["staleness_max"] <= 1 for s in metrics)
    # every reward -1: no advantage moves the policy, which stays at its start (before and after the resume)
    assert all(abs(metrics[s]["kl_to_start"]) < 1e-6 and 0 <= metrics[s]["clip_fraction"] <= 1 for s in metrics)
    assert all(metrics[s]["sampled_token_entropy"] > 0 and metrics[s]["kl_to_behaviour"] >= 0 for s in metrics)
    assert sorted(int(n) for n in os.listdir(os.path.join(workdir, "checkpoints"))) == [1, 2]
    assert os.path.exists(os.path.join(workdir, "model", "tokenizer.json"))
    assert asyncio.run(run(config)) == {k: v for k, v in metrics[2].items() if k != "step"}  # done: nothing run
    with pytest.raises(StaleStage, match=r"optim.peak_lr: 0.001 -> 0.002"):
        asyncio.run(run(from_config(RLConfig, {**to_dict(config), "optim": {"peak_lr": 0.002}})))


def _fake_rollouts(rewards: list[float | None], task_id: str) -> list[ScoredRollout]:
    return [ScoredRollout(Trajectory(task_id=task_id, messages=[]), r, "completed" if r is not None else "aborted", 5)
            for r in rewards]


def test_dynamic_filtering_replaces_a_dropped_prompt_with_a_spare():
    class Workers:  # the "easy" task is always solved; the "mixed" one half the time
        async def rollouts(self, task, step, first, count):
            rewards = [1.0] * count if task.id == "easy" else [1.0, -1.0] * (count // 2)
            return _fake_rollouts(rewards, task.id)

    easy, mixed = SimpleNamespace(id="easy"), SimpleNamespace(id="mixed")
    spent = []
    groups = asyncio.run(gather_groups(Workers(), DynamicFilter(4), [easy], step=0, spares=[mixed, easy], spent=spent))
    assert [len(g.group) for g in groups] == [0, 4]  # dropped, then the first spare filled the slot
    assert [r.trajectory.task_id for r in spent] == ["easy"] * 4 + ["mixed"] * 4  # every rollout, the dropped too
    metrics = group_metrics(groups)
    assert metrics["groups_dropped"] == 1.0 and metrics["rollouts_per_update"] == 8.0
    assert metrics["resolve_rate"] == 6 / 8  # over every rollout spent, the dropped group's included
    assert metrics["informative_groups"] == 0.5  # counted over both groups, as the rollouts were spent on both
    # the update's groups: one, informative, with half its rollouts positive
    assert (metrics["groups_chosen"], metrics["informative_chosen"], metrics["positive_fraction"]) == (1.0, 1.0, 0.5)


def test_a_step_whose_every_rollout_broke_outside_the_policy_stops_the_run():
    """No update on nothing, step after step: the run stops at its last checkpoint with the first error."""
    from orchard.data.trajectory import EndReason
    from orchard.eval.runner import EnvironmentDown
    from orchard.train.rl import collect_step

    class Workers:
        def __init__(self, broken: int) -> None:
            self.broken = broken

        async def rollouts(self, task, step, first, count):
            rollouts = _fake_rollouts([None] * count, task.id)
            for rollout in rollouts[:self.broken]:
                rollout.trajectory.metadata.update(end_reason=EndReason.SANDBOX_ERROR, error="BackendUnavailable: down")
            return rollouts

    tasks, config = [SimpleNamespace(id="a"), SimpleNamespace(id="b")], RLConfig(prompts_per_step=2)
    with pytest.raises(EnvironmentDown, match=r"rl step 3: all 4 episodes broke .*BackendUnavailable: down"):
        asyncio.run(collect_step(3, Workers(broken=2), FixedGroup(2), tasks, config))
    collected = asyncio.run(collect_step(3, Workers(broken=1), FixedGroup(2), tasks, config))  # one of each pair
    assert len(collected.generated) == 4 and all(not g.group for g in collected.groups)  # dropped, not raised


def test_an_rl_step_logs_how_far_the_policy_moved_from_the_behaviour_and_the_start_policy():
    """The step's diagnostics: the KL to the start policy is 0 while the parameters are the start
    policy's, and grows once an update moved them; the start parameters outlive the donated state."""
    from orchard.models.sharding import MeshConfig

    model = Transformer(ModelConfig.tiny(256, num_layers=1, **TINY), rngs=nnx.Rngs(0))
    optimizer, schedule = make_optimizer(OptimConfig(1e-2, 1e-3, 1), 10)
    graphdef, state = init_state(model, optimizer, MeshConfig().make())
    start = jax.tree.map(jnp.copy, state.params)
    kept = [np.asarray(x).copy() for x in jax.tree.leaves(start)]
    config = RLConfig(prompts_per_step=1, seq_len=12, rows=2, micro_rows=1)  # a row per rollout: two micro-batches

    class Engine:
        def update_weights(self, weights):
            pass

    def make_step(grid):
        return make_train_step(graphdef, optimizer, schedule, make_policy_loss(diagnostics=True, image_grid=grid))

    learner = Learner(graphdef, make_step, MeshConfig().make(), Engine(), None, config, start_params=start)

    # old logprobs about the random policy's (log 1/256 = -5.5): ratios inside and outside the clip range
    old_logprobs = [np.log(1 / 256) + offset for offset in (-0.6, -0.1, 0.0, 0.1, 0.6)]

    class Workers:  # proxy-recorded rollouts (no sandbox): sample 0 wins, so the group has variance
        async def rollouts(self, task, step, first, count):
            rollouts = []
            for sample in range(first, first + count):
                sampled = [(11 * sample + i) % 256 for i in range(5)]
                trajectory = Trajectory(task_id=task.id, messages=[
                    Message(role="user", content="go"),
                    Message(role="assistant", token_ids=sampled, logprobs=old_logprobs)],
                    metadata={"recorded_prompt_ids": [[1, 2, 3, 4, 5]]})
                rollouts.append(ScoredRollout(trajectory, float(sample == 0), "completed", len(sampled)))
            return rollouts

    task = SimpleNamespace(id="t")
    state, first = asyncio.run(rl_step(0, state, learner, Workers(), FixedGroup(2), [task]))
    metrics = first.metrics
    assert {"clip_fraction", "kl_to_behaviour", "sampled_token_entropy", "kl_to_start"} <= set(metrics), metrics
    assert abs(metrics["kl_to_start"]) < 1e-6  # the first update's parameters are the start policy's
    assert metrics["sampled_token_entropy"] == pytest.approx(-np.mean(old_logprobs), rel=1e-6)
    # the behaviour's statistics against the learner's own logprobs (the start policy's, at this update)
    rows, _ = learner.rows(first.groups)
    logp = np.asarray(make_reference_logprobs(graphdef)(start, rows))
    trained, old = rows["loss_mask"] > 0, rows["old_logprobs"]
    ratio = np.exp(logp - old)[trained]
    assert 0 < metrics["clip_fraction"] < 1
    assert metrics["clip_fraction"] == pytest.approx(np.mean((ratio < 0.8) | (ratio > 1.28)), abs=1e-6)
    d = (logp - old)[trained]
    assert metrics["kl_to_behaviour"] == pytest.approx(np.mean(np.exp(d) - d - 1), rel=1e-4)

    state, second = asyncio.run(rl_step(1, state, learner, Workers(), FixedGroup(2), [task]))
    assert second.metrics["kl_to_start"] > 1e-6  # the first update moved the policy away from its start
    for a, b in zip(jax.tree.leaves(learner.start_params), kept, strict=True):  # alive and unchanged
        np.testing.assert_array_equal(np.asarray(a), b)


def test_an_asynchronous_learner_serves_weights_that_outlive_its_next_donated_step():
    """With max_staleness the engine samples while the learner's next train step runs, and that step donates
    the state's arrays: the engine must serve a copy (served directly, its arrays are deleted by the step)."""
    from orchard.models.sharding import MeshConfig
    from orchard.rollout.jax_engine import JaxEngine
    from orchard.train.rollouts import pack_rollouts

    model = Transformer(ModelConfig.tiny(256, num_layers=1, **TINY), rngs=nnx.Rngs(0))
    engine = JaxEngine(model)
    optimizer, schedule = make_optimizer(OptimConfig(1e-3, 1e-4, 1), 10)
    mesh = MeshConfig().make()
    graphdef, state = init_state(model, optimizer, mesh)
    train_step = make_train_step(graphdef, optimizer, schedule, loss_fn=make_policy_loss())
    learner = Learner(graphdef, lambda grid: train_step, mesh, engine, None, RLConfig(max_staleness=1))
    packed = pack_rollouts([{"token_ids": list(range(1, 12)), "loss_mask": [0] * 5 + [1] * 6,
                             "old_logprobs": [-5.5] * 11, "advantages": [1.0] * 11}], 16, 2, 2)
    learner.sync(state)
    greedy = SamplingParams(max_tokens=4, temperature=0.0)
    before = engine.generate([[1, 2, 3]], greedy)
    state, _ = train_step(state, {k: v.reshape(-1, 2, *v.shape[1:]) for k, v in packed.items()})
    assert engine.generate([[1, 2, 3]], greedy)[0].token_ids == before[0].token_ids  # the synced weights, alive
    assert engine.weight_version == 0 and int(state.step) == 1


def test_a_group_samples_fresh_indices_for_every_stride():
    asked = []

    class Workers:
        async def rollouts(self, task, step, first, count):
            asked.append((task.id, step, first, count))
            return _fake_rollouts([-1.0, None][: count] + [-1.0] * max(count - 2, 0), task.id)

    [group] = asyncio.run(gather_groups(Workers(), BAR(2, 6, 2), [SimpleNamespace(id="t")], step=5))
    assert asked == [("t", 5, 0, 2), ("t", 5, 2, 2), ("t", 5, 4, 2)]  # stride by stride, never a repeated sample
    assert group.dropped == 3 and group_metrics([group])["rollouts_dropped"] == 3.0
    assert all(r.reward is not None for r in group.group)


def test_the_config_names_the_rollout_engine(smollm2_tokenizer):
    from orchard.rollout.openai_engine import OpenAIEngine, ReloadFromDisk

    vllm = make_engine(EngineConfig("vllm", "http://vllm:8000/v1", "policy", "/weights/policy"), None,
                       smollm2_tokenizer)
    assert isinstance(vllm, OpenAIEngine) and vllm.model == "policy"
    assert isinstance(vllm.weight_sync, ReloadFromDisk) and vllm.weight_sync.directory == "/weights/policy"
    assert [replica.root for replica in vllm.replicas] == ["http://vllm:8000"]
    two = make_engine(EngineConfig("vllm", "http://a:8000/v1, http://b:8000/v1", "policy", "/w"), None,
                      smollm2_tokenizer)
    assert [replica.root for replica in two.replicas] == ["http://a:8000", "http://b:8000"]  # replicas, comma-separated
    with pytest.raises(ValueError, match="unknown rollout engine 'sglang'"):
        make_engine(EngineConfig("sglang"), None, smollm2_tokenizer)


def test_rollout_config_builds_the_limits_and_sampling_rl_and_evaluation_share():
    rollout = RolloutConfig(max_new_tokens=32, temperature=0.7, max_turns=4, max_context=900, episode_seconds=60.0)
    assert rollout.limits == Limits(max_turns=4, max_tokens=900, time_limit=60.0)
    assert rollout.sampling(seed=3) == SamplingParams(max_tokens=32, temperature=0.7, seed=3)
    assert rollout.sampling(seed=3, temperature=0.0).temperature == 0.0


class _PassRates:
    """Stands in for RolloutWorkers: each task's rollouts resolve by a fixed script."""

    def __init__(self, scripts: dict[str, list[float | None]]) -> None:
        self.scripts, self.asked = scripts, []

    async def rollouts(self, task, step, first, count):
        self.asked.append((task.id, step, count))
        trajectory = Trajectory(task_id=task.id, messages=[], outcome=Outcome())
        return [ScoredRollout(trajectory, reward, "", 0) for reward in self.scripts[task.id][:count]]


def test_the_pass_rate_filter_keeps_prompts_in_its_window_and_a_resumed_run_keeps_its_choice(tmp_path):
    tasks = [SimpleNamespace(id=name) for name in ("always", "quarter", "half", "never", "dropped")]
    workers = _PassRates({"always": [1.0] * 4, "quarter": [1.0, -1.0, -1.0, -1.0], "half": [-1.0, 1.0, None, -1.0, 1.0],
                          "never": [-1.0] * 4, "dropped": [None] * 4})
    kept, rates = asyncio.run(filter_by_pass_rate(workers, tasks, 4, 0.0, 0.5))
    assert [t.id for t in kept] == ["quarter", "half"]
    assert rates["always"] == 1.0 and rates["quarter"] == 0.25 and rates["never"] == 0.0
    assert rates["half"] == pytest.approx(1 / 3)  # a dropped rollout does not count
    assert np.isnan(rates["dropped"])
    assert sorted(workers.asked) == sorted((t.id, "pass_filter", 4) for t in tasks)

    config = PassFilterConfig(samples=4, low=0.0, high=0.5)
    chosen = asyncio.run(rl_prompts(config, str(tmp_path / "rl"), workers, tasks))
    assert [t.id for t in chosen] == [t.id for t in kept]
    again = _PassRates({t.id: [1.0] * 4 for t in tasks})  # a resumed run: the saved choice, no rollouts
    assert asyncio.run(rl_prompts(config, str(tmp_path / "rl"), again, tasks)) == chosen and not again.asked
    # No prompt in the window: RL samples them all rather than none.
    none = asyncio.run(rl_prompts(config, str(tmp_path / "none"), again, tasks))
    assert none == tasks and len(again.asked) == len(tasks)
    off = PassFilterConfig(samples=0)  # no filter: every prompt, and no rollouts spent
    assert asyncio.run(rl_prompts(off, str(tmp_path / "off"), _PassRates({}), tasks)) == tasks


HARNESS_SCRIPT = """
import openai
client = openai.OpenAI(max_retries=0)  # OPENAI_BASE_URL and OPENAI_API_KEY: the proxy session's
messages = [{"role": "user", "content": "Say hi."}]
reply = client.chat.completions.create(model="whatever", messages=messages, max_tokens=6, temperature=2.0)
messages += [{"role": "assistant", "content": reply.choices[0].message.content}, {"role": "user", "content": "Again."}]
client.chat.completions.create(model="whatever", messages=messages, max_tokens=6)
"""


@pytest.mark.slow
def test_a_grpo_step_on_rollouts_recorded_through_the_proxy(orchestrator, smollm2_tokenizer, tmp_path):
    """A harness Orchard does not run (a process of its own, the openai SDK) samples through the
    recording proxy from ``orchard serve``; the step trains on the recorded ids and logprobs, so its
    first update is at ratio one, and the server then serves the updated weights."""
    import sys

    from orchard.env.local import free_port
    from orchard.harness.adapters.external import ExternalHarness, ExternalRunner
    from orchard.harness.task import FunctionTask
    from orchard.rollout.openai_engine import OpenAIEngine, ReloadFromDisk
    from orchard.rollout.proxy_client import ProxyClient
    from tests.conftest import ADMIN, cli_server, start_model_server

    config = RLConfig(prompts_per_step=1, **STEP)
    _, state, learner = tiny_learner(smollm2_tokenizer, 2, config)
    served = str(tmp_path / "policy")
    save_pretrained(nnx.merge(learner.graphdef, state.params), served)
    smollm2_tokenizer.save_pretrained(served)

    async def grade(_, trajectory: Trajectory) -> Outcome:  # sample 0 wins: the group has variance
        return Outcome(reward=1.0 if trajectory.metadata["sample"] == 0 else -1.0)

    task = FunctionTask("hello", "Say hi.", grade_fn=grade)
    harness = ExternalHarness("openai-sdk-script", [sys.executable, "-c", HARNESS_SCRIPT], wall_clock_s=120)
    for server in start_model_server(served, str(tmp_path / "serve.log")):
        port = free_port()
        args = ["proxy", "--upstream", server.url, "--records", str(tmp_path / "records"), "--admin-key", ADMIN,
                "--port", str(port)]
        for _ in cli_server(args, port, str(tmp_path / "proxy.log"), timeout=60):
            learner.engine = OpenAIEngine(server.url, server.name, weight_sync=ReloadFromDisk(served))

            async def run(proxy_url: str):
                async with orchestrator.async_client() as client:
                    proxy = ProxyClient(proxy_url, ADMIN)
                    workers = RolloutWorkers(ExternalRunner(client, harness, proxy, sampling={"temperature": 1.0}))
                    try:
                        return await rl_step(0, state, learner, workers, FixedGroup(2), [task])
                    finally:
                        await proxy.aclose()

            new_state, step = asyncio.run(run(f"http://127.0.0.1:{port}"))
            [group] = step.groups
            rows, _ = learner.rows(step.groups)
            again = learner.engine.generate([[1, 2, 3]], SamplingParams(max_tokens=2, temperature=0))
    for rollout in group.group:
        trajectory = rollout.trajectory
        assert trajectory.harness == "openai-sdk-script" and trajectory.metadata["trainable"], trajectory.metadata
        assert len(trajectory.metadata["recorded_prompt_ids"]) == 2  # both calls, with the prompts they were sampled under
    trained = rows["loss_mask"] > 0
    expected = -float(np.sum(rows["advantages"][trained])) / trained.sum()
    assert step.metrics["loss"] == pytest.approx(expected, abs=1e-4)  # ratio one: the recorded logprobs are the learner's
    assert step.metrics["trained_tokens"] == trained.sum() == sum(
        len(m.token_ids) for r in group.group for m in r.trajectory.messages if m.role == "assistant")
    assert again[0].weight_version == 1 == int(new_state.step)  # the server reloaded the update
