"""One RL step end to end: a JAX policy in real sandboxes, BAR groups, a GRPO update, the weight sync."""

from __future__ import annotations

import asyncio
import os

import jax
import numpy as np
import pytest
from flax import nnx

from orchard.data.chat import smollm2_format
from orchard.data.tokenizer import Tokenizer
from orchard.data.trajectory import Outcome, Trajectory
from orchard.env import AsyncSandboxClient
from orchard.harness.bash import BashHarness
from orchard.harness.core import Limits
from orchard.harness.policies import EnginePolicy
from orchard.models import ModelConfig, Transformer
from orchard.models.sharding import make_mesh
from orchard.models.shipped import smollm2_gguf
from orchard.rollout.jax_engine import JaxEngine
from orchard.rollout.sampler import SamplingParams
from orchard.tasks.swe.generate import generate_task_set
from orchard.tasks.swe.sources import resolve_source
from orchard.train.bar import BAR
from orchard.train.grpo import make_policy_loss
from orchard.train.rl import RolloutWorkers, rl_step, score
from orchard.train.state import init_state, make_optimizer, make_train_step


def tiny_learner(num_layers: int):
    """A tiny random policy over SmolLM2's vocabulary, its engine and a GRPO train step."""
    tokenizer = Tokenizer.from_gguf(smollm2_gguf())  # a 49K vocabulary keeps the learner's logits small
    cfg = ModelConfig(model_type="llama", vocab_size=49152, hidden_size=32, intermediate_size=64, num_layers=num_layers,
                      num_heads=4, num_kv_heads=2, head_dim=8, max_position_embeddings=4096, dtype="float32")
    chat, model = smollm2_format(tokenizer), Transformer(cfg, rngs=nnx.Rngs(0))
    engine = JaxEngine(model, tokenizer)
    policy = EnginePolicy(engine, chat, SamplingParams(max_tokens=16, temperature=1.0))
    mesh = make_mesh(1, 1)
    optimizer, schedule = make_optimizer(1e-3, 1e-4, 1, 10, 0.0, 1.0)
    graphdef, state = init_state(model, optimizer, mesh)
    train_step = make_train_step(graphdef, optimizer, schedule, loss_fn=make_policy_loss())
    return chat, engine, policy, mesh, graphdef, state, train_step


def test_rewards_and_dropped_rollouts():
    def run(resolved: bool, **metadata) -> Trajectory:
        return Trajectory(task_id="t", messages=[], outcome=Outcome(resolved=resolved), metadata=metadata)

    assert score(run(True, end_reason="submitted")).reward == 1.0
    assert score(run(False, end_reason="step_limit")).reward == -1.0
    assert score(run(False, end_reason="sandbox_error")).reward is None  # not the policy's fault: dropped


def test_one_rl_step_in_real_sandboxes(orchestrator, tmp_path):
    [instance], _ = generate_task_set([resolve_source("minicalc")], 1, str(tmp_path), seed=2, tests_visible=True)
    chat, engine, policy, mesh, graphdef, state, train_step = tiny_learner(num_layers=2)

    async def run():
        client = AsyncSandboxClient(orchestrator.base_url, api_key=orchestrator.api_key)
        try:
            workers = RolloutWorkers(client, BashHarness(), policy, Limits(max_steps=2), concurrency=2)
            result = await rl_step(0, state, train_step, graphdef, engine, workers, BAR(2, 4, 2), [instance], chat,
                                   mesh, prompts_per_step=1, seq_len=2048, rows=2, seed=0)
            return result, workers.spent, {info.id for info in await client.list()}
        finally:
            await client.aclose()

    (new_state, step), spent, alive = asyncio.run(run())
    [group] = step.groups
    assert spent == 4 == group.spent  # a random policy never resolves: BAR spends its budget, then relaxes
    assert group.fallback == "relaxed" and len(group.group) == 2 and not group.informative
    assert step.metrics["resolve_rate"] == 0.0 and step.metrics["reward"] == -1.0
    assert step.metrics["fallback_relaxed"] == 1.0 and step.metrics["informative_groups"] == 0.0
    assert step.metrics["trained_tokens"] > 0 and step.metrics["loss"] == pytest.approx(0.0, abs=1e-6)  # no variance
    assert not {r.trajectory.metadata["sandbox_id"] for r in group.group} & alive
    for rollout in group.group:
        assert all(m.token_ids and m.logprobs for m in rollout.trajectory.messages if m.role == "assistant")
    # The engine serves the learner's new parameters.
    served = jax.tree.leaves(engine.sampler.state)
    learned = jax.tree.leaves(new_state.params)
    assert all(np.array_equal(np.asarray(a), np.asarray(b)) for a, b in zip(served, learned, strict=True))


def test_evaluate_measures_the_resolve_rate_of_a_policy(orchestrator, tmp_path):
    """The oracle teacher as the policy: its clean runs resolve every held-out task."""
    from orchard.tasks.swe.oracle import OracleTeacher
    from orchard.train.rl import evaluate

    instances, _ = generate_task_set([resolve_source("stockroom")], 2, str(tmp_path), seed=4, tests_visible=True)

    class Oracle:  # one policy for every task, as an evaluated model is
        name = "oracle"

        async def act(self, conversation, *, max_context=None):
            task = next(i for i in instances if i.problem_statement in conversation.messages[1].content)
            return await OracleTeacher(task, "bash").act(conversation, max_context=max_context)

    async def run(policy) -> tuple:
        client = AsyncSandboxClient(orchestrator.base_url, api_key=orchestrator.api_key)
        try:
            return await evaluate(RolloutWorkers(client, BashHarness(), policy, Limits(max_steps=12), 2), instances)
        finally:
            await client.aclose()

    result, episodes = asyncio.run(run(Oracle()))
    assert sorted(t.task_id for t in episodes) == sorted(i.instance_id for i in instances)
    assert all(t.outcome.resolved for t in episodes)
    assert result == {"resolve_rate": 1.0, "episodes": 2.0, "tasks_solved": 2.0, "turns": result["turns"]}
    assert result["turns"] >= 5


def test_train_rl_writes_metrics_and_resumes(orchestrator, tmp_path):
    from configs.swe_bar import get_config
    from orchard.train.metrics import read_metrics
    from orchard.train.rl import train_rl

    [instance], _ = generate_task_set([resolve_source("textkit")], 1, str(tmp_path / "tasks"), seed=3,
                                      tests_visible=True)
    config = get_config("tiny")
    config.tokenizer.path = "smollm2"
    config.model.init.update({"vocab_size": 49152, "hidden_size": 32, "intermediate_size": 64, "num_layers": 1})
    config.num_steps, config.checkpoint_every = 1, 1
    config.rl.sampler.update({"name": "fixed", "group_size": 2})
    config.rl.update({"prompts_per_step": 1, "max_new_tokens": 16, "max_turns": 2, "seq_len": 2048, "rows": 2})
    config.rl.updates_per_batch = 2  # the checkpointed state counts 2 updates a step; resuming must divide
    workdir = str(tmp_path / "rl")

    async def run(steps: int) -> dict:
        config.num_steps = steps
        client = AsyncSandboxClient(orchestrator.base_url, api_key=orchestrator.api_key)
        try:
            return await train_rl(config, workdir, client, [instance], BashHarness())
        finally:
            await client.aclose()

    asyncio.run(run(1))
    asyncio.run(run(2))  # resumes at step 1 and runs step 2 only
    metrics = read_metrics(workdir)
    assert sorted(metrics) == [1, 2]
    with open(os.path.join(workdir, "metrics.jsonl")) as handle:
        assert len(handle.readlines()) == 2  # step 1 ran once: the second run resumed after it
    assert all(metrics[s]["rollouts_per_group"] == 2 and metrics[s]["reward"] == -1.0 for s in metrics)
    assert {"informative_groups", "fallback_relaxed", "rollout_s", "learn_s", "tokens_per_s"} <= set(metrics[2])
    assert sorted(int(n) for n in os.listdir(os.path.join(workdir, "checkpoints"))) == [1, 2]


class _Scripted:
    """A policy that runs ``on_act`` before answering with one harmless command."""

    name = "scripted"

    def __init__(self, on_act) -> None:
        self.on_act = on_act

    async def act(self, conversation, *, max_context=None):
        from orchard.data.trajectory import Message
        from orchard.harness.core import Turn

        await self.on_act()
        return Turn(Message(role="assistant", content="THOUGHT: look.\n\n```bash\nls\n```"))


def test_the_loop_survives_a_sandbox_that_dies_and_a_rollout_that_times_out(orchestrator, tmp_path):
    [instance], _ = generate_task_set([resolve_source("minicalc")], 1, str(tmp_path), seed=2, tests_visible=True)

    async def run():
        client = AsyncSandboxClient(orchestrator.base_url, api_key=orchestrator.api_key)
        before = {info.id for info in await client.list()}
        try:
            async def kill_my_sandbox():  # the sandbox disappears under the running episode
                for info in await client.list():
                    if info.id not in before:
                        await client.delete(info.id)

            async def hang():
                await asyncio.sleep(30)

            killed = RolloutWorkers(client, BashHarness(), _Scripted(kill_my_sandbox), Limits(max_steps=3), 1)
            slow = RolloutWorkers(client, BashHarness(), _Scripted(hang), Limits(max_steps=3, time_limit=1.0), 1)
            stuck = RolloutWorkers(client, BashHarness(), _Scripted(hang), Limits(max_steps=3), 1, rollout_seconds=3.0)
            results = [await workers.rollouts(instance, 1, seed=0) for workers in (killed, slow, stuck)]
            return results, {info.id for info in await client.list()} - before
        finally:
            await client.aclose()

    ([dead], [timed_out], [stuck]), leftover = asyncio.run(run())
    assert dead.reward is None and dead.trajectory.metadata["end_reason"] == "sandbox_error"  # dropped
    assert timed_out.reward == -1.0 and timed_out.status == "timed_out"  # too slow: the policy's failure
    assert stuck.reward is None and "TimeoutError" in stuck.trajectory.metadata["error"]  # the rollout's budget
    assert leftover == set()  # every sandbox deleted


def test_an_rl_step_with_reward_variance_changes_the_parameters_and_syncs_them(orchestrator, tmp_path):
    """A random tiny policy never resolves a task, so this grader double marks the first rollout
    of each group resolved: the group has variance and the updates are not zero."""
    from orchard.train.bar import FixedGroup

    class FirstResolves(FixedGroup):
        async def sample(self, generate):
            async def marked(k):
                rollouts = await generate(k)
                rollouts[0].reward = 1.0
                return rollouts

            return await super().sample(marked)

    [instance], _ = generate_task_set([resolve_source("minicalc")], 1, str(tmp_path), seed=2, tests_visible=True)
    chat, engine, policy, mesh, graphdef, state, train_step = tiny_learner(num_layers=1)
    before = [np.asarray(x).copy() for x in jax.tree.leaves(state.params)]

    async def run():
        client = AsyncSandboxClient(orchestrator.base_url, api_key=orchestrator.api_key)
        try:
            workers = RolloutWorkers(client, BashHarness(), policy, Limits(max_steps=1), concurrency=2)
            return await rl_step(1, state, train_step, graphdef, engine, workers, FirstResolves(2), [instance], chat,
                                 mesh, prompts_per_step=1, seq_len=2048, rows=2, seed=0, updates=2)
        finally:
            await client.aclose()

    new_state, step = asyncio.run(run())
    assert step.metrics["informative_groups"] == 1.0 and step.metrics["loss"] != 0.0, step.metrics
    assert int(new_state.step) == 2  # GRPO's iterations: two updates on the step's rollouts
    after = [np.asarray(x) for x in jax.tree.leaves(new_state.params)]
    assert any(not np.array_equal(a, b) for a, b in zip(before, after, strict=True))  # the update moved them
    served = [np.asarray(x) for x in jax.tree.leaves(engine.sampler.state)]
    assert all(np.array_equal(a, b) for a, b in zip(served, after, strict=True))  # and the engine has them


def test_dynamic_filtering_replaces_a_dropped_prompt_with_a_spare():
    from orchard.train.bar import DynamicFilter
    from orchard.train.rl import ScoredRollout, gather_groups, group_metrics

    class Workers:  # the "easy" task is always solved; the "mixed" one half the time
        async def rollouts(self, instance, count, seed):
            rewards = [1.0] * count if instance == "easy" else [1.0, -1.0] * (count // 2)
            return [ScoredRollout(Trajectory(task_id=instance, messages=[]), r, "completed", 5) for r in rewards]

    groups = asyncio.run(gather_groups(Workers(), DynamicFilter(4), ["easy"], step_seed=0, spares=["mixed", "easy"]))
    assert [len(g.group) for g in groups] == [0, 4]  # dropped, then the first spare filled the slot
    metrics = group_metrics(groups)
    assert metrics["groups_dropped"] == 1.0 and metrics["rollouts_per_update"] == 8.0
    assert metrics["resolve_rate"] == 6 / 8  # over every rollout spent, the dropped group's included
    assert metrics["informative_groups"] == 0.5  # counted over both groups, as the rollouts were spent on both


def test_the_config_names_the_rollout_engine():
    from ml_collections import ConfigDict

    from orchard.rollout.openai_engine import OpenAIEngine, ReloadFromDisk
    from orchard.train.rl import make_engine

    tokenizer = Tokenizer.from_gguf(smollm2_gguf())
    vllm = make_engine(ConfigDict({"kind": "vllm", "url": "http://vllm:8000/v1", "served_model": "policy",
                                   "weights_dir": "/weights/policy"}), None, tokenizer)
    assert isinstance(vllm, OpenAIEngine) and vllm.model == "policy"
    assert isinstance(vllm.weight_sync, ReloadFromDisk) and vllm.weight_sync.directory == "/weights/policy"
    assert str(vllm.client.base_url).rstrip("/") == "http://vllm:8000"
    with pytest.raises(ValueError, match="unknown rollout engine 'sglang'"):
        make_engine(ConfigDict({"kind": "sglang"}), None, tokenizer)


class _PassRates:
    """Stands in for RolloutWorkers: each instance's rollouts resolve by a fixed script."""

    def __init__(self, scripts: dict[str, list[float | None]]) -> None:
        self.scripts, self.asked = scripts, []

    async def rollouts(self, instance, count, seed):
        from orchard.train.rl import ScoredRollout

        self.asked.append((instance.instance_id, count))
        trajectory = Trajectory(task_id=instance.instance_id, messages=[], outcome=Outcome())
        return [ScoredRollout(trajectory, reward, "", 0) for reward in self.scripts[instance.instance_id][:count]]


def test_the_pass_rate_filter_keeps_prompts_in_its_window_and_a_resumed_run_keeps_its_choice(tmp_path):
    from types import SimpleNamespace

    from configs.swe_bar import get_config
    from orchard.train.rl import filter_by_pass_rate, rl_prompts

    instances = [SimpleNamespace(instance_id=name) for name in ("always", "quarter", "half", "never", "dropped")]
    workers = _PassRates({"always": [1.0] * 4, "quarter": [1.0, -1.0, -1.0, -1.0], "half": [-1.0, 1.0, None, -1.0, 1.0],
                          "never": [-1.0] * 4, "dropped": [None] * 4})
    kept, rates = asyncio.run(filter_by_pass_rate(workers, instances, 4, 0.0, 0.5, seed=0))
    assert [i.instance_id for i in kept] == ["quarter", "half"]
    assert rates["always"] == 1.0 and rates["quarter"] == 0.25 and rates["never"] == 0.0
    assert rates["half"] == pytest.approx(1 / 3)  # a dropped rollout does not count
    assert np.isnan(rates["dropped"])
    assert sorted(workers.asked) == sorted((i.instance_id, 4) for i in instances)

    config = get_config("tiny")
    config.rl.pass_filter.update({"samples": 4, "low": 0.0, "high": 0.5})
    chosen = asyncio.run(rl_prompts(config, str(tmp_path / "rl"), workers, instances))
    assert [i.instance_id for i in chosen] == [i.instance_id for i in kept]
    again = _PassRates({i.instance_id: [1.0] * 4 for i in instances})  # a resumed run: the saved choice, no rollouts
    assert asyncio.run(rl_prompts(config, str(tmp_path / "rl"), again, instances)) == chosen and not again.asked
    # No prompt in the window: RL samples them all rather than none.
    none = asyncio.run(rl_prompts(config, str(tmp_path / "none"), again, instances))
    assert none == instances and len(again.asked) == len(instances)
    config.rl.pass_filter.samples = 0  # no filter: every prompt, and no rollouts spent
    assert asyncio.run(rl_prompts(config, str(tmp_path / "off"), _PassRates({}), instances)) == instances
