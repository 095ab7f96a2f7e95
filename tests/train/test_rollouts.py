"""Rollouts to GRPO rows: sampled tokens line up with their old logprobs, end to end through a step."""

from __future__ import annotations

import jax
import numpy as np
import pytest

from orchard.data.chat import Qwen3Format
from orchard.data.tokenizer import Tokenizer
from orchard.data.trajectory import Message, Outcome, Trajectory
from orchard.models.sharding import make_mesh
from orchard.rollout.jax_engine import JaxEngine
from orchard.rollout.sampler import SamplingParams
from orchard.train.grpo import group_advantages, make_policy_loss
from orchard.train.rollouts import pack_rollouts, policy_example
from orchard.train.state import batch_sharding, init_state, make_optimizer, make_train_step
from tests.fixtures.chat.qwen3_tokenizer import qwen3_tokenizer_dir
from tests.rollout.conftest import tiny_qwen3


@pytest.fixture(scope="module")
def tokenizer() -> Tokenizer:
    return Tokenizer.from_pretrained(qwen3_tokenizer_dir())


def rollouts(tokenizer, model, count: int) -> list[Trajectory]:
    """Real rollouts: a tiny model samples two assistant turns with the JAX engine."""
    chat, engine = Qwen3Format(tokenizer), JaxEngine(model, tokenizer)
    out = []
    for seed in range(count):
        messages = [Message(role="user", content="Fix the bug.")]
        for turn in range(2):
            prompt = chat.render([m.to_chat() for m in messages], add_generation_prompt=True).token_ids
            [done] = engine.generate([prompt], SamplingParams(max_tokens=6, temperature=1.0, seed=seed * 10 + turn))
            messages += [Message(role="assistant", content=done.text, token_ids=done.token_ids, logprobs=done.logprobs),
                         Message(role="tool", content=f"observation {turn}")]
        out.append(Trajectory(task_id="t", messages=messages, outcome=Outcome(reward=float(seed % 2))))
    return out


def test_only_sampled_tokens_train_with_their_logprobs(tokenizer):
    [run] = rollouts(tokenizer, tiny_qwen3(seed=0), 1)
    example = policy_example(run, 0.5, Qwen3Format(tokenizer))
    trained = [i for i, keep in enumerate(example["loss_mask"]) if keep]
    sampled = [m for m in run.messages if m.role == "assistant"]
    assert [example["token_ids"][i] for i in trained] == sampled[0].token_ids + sampled[1].token_ids
    assert [example["old_logprobs"][i] for i in trained] == sampled[0].logprobs + sampled[1].logprobs
    assert not any(policy_example(run, None, Qwen3Format(tokenizer))["loss_mask"])  # a dropped rollout
    # The observation after the last action trains nothing and is not rendered.
    last_action = Qwen3Format(tokenizer).render([m.to_chat() for m in run.messages[:-1]]).token_ids
    assert example["token_ids"] == last_action and run.messages[-1].role == "tool"
    row = pack_rollouts([example], seq_len=128, rows=2)
    targets = row["targets"][0][row["loss_mask"][0] > 0].tolist()
    assert targets == sampled[0].token_ids + sampled[1].token_ids  # shifted onto the predicting position
    assert row["old_logprobs"][0][row["loss_mask"][0] > 0].tolist() == pytest.approx(
        sampled[0].logprobs + sampled[1].logprobs)
    assert row["loss_mask"][1].sum() == 0  # a padding row
    with pytest.raises(ValueError, match="only 1 given"):
        pack_rollouts([example] * 3, seq_len=len(example["token_ids"]), rows=1)
    with pytest.raises(ValueError, match="do not fit"):
        pack_rollouts([example], seq_len=16, rows=4)


def test_a_grpo_step_on_fresh_rollouts_starts_at_ratio_one(tokenizer):
    """Old logprobs from the engine equal the learner's own, so the first loss is -mean(advantage)."""
    model = tiny_qwen3(seed=0)
    runs = rollouts(tokenizer, model, 4)
    advantages = group_advantages([r.outcome.reward for r in runs])
    chat = Qwen3Format(tokenizer)
    examples = [policy_example(r, a, chat) for r, a in zip(runs, advantages, strict=True)]
    batch = pack_rollouts(examples, seq_len=128, rows=4)
    mesh = make_mesh(1, 1)
    optimizer, schedule = make_optimizer(1e-3, 1e-4, 1, 10, 0.0, 1.0)
    graphdef, state = init_state(model, optimizer, mesh)
    step = make_train_step(graphdef, optimizer, schedule, loss_fn=make_policy_loss())
    _, metrics = step(state, jax.device_put({k: v[None] for k, v in batch.items()}, batch_sharding(mesh)))
    trained = batch["loss_mask"] > 0
    expected = -float(np.sum(batch["advantages"][trained])) / trained.sum()
    assert float(metrics["loss"]) == pytest.approx(expected, abs=1e-4)
    assert float(metrics["tokens"]) == trained.sum() == sum(len(m.token_ids) for r in runs for m in r.messages
                                                            if m.role == "assistant")
