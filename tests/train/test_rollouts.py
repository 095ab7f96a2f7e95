"""Rollouts to GRPO rows: sampled tokens line up with their old logprobs, per trajectory and per turn, each
row's prompt checked against what was sampled, end to end through a step."""

from __future__ import annotations

import jax
import numpy as np
import pytest

from orchard.data.chat import Qwen3Format
from orchard.data.examples import PromptMismatch
from orchard.data.tokenizer import Tokenizer
from orchard.data.trajectory import Message, Outcome, Trajectory, token_digest
from orchard.models.sharding import make_mesh
from orchard.rollout.jax_engine import JaxEngine
from orchard.rollout.types import SamplingParams
from orchard.train.grpo import group_advantages, make_policy_loss
from orchard.train.rollouts import pack_rollouts, policy_rows, recorded_rows, trajectory_row, turn_rows
from orchard.train.state import OptimConfig, batch_sharding, init_state, make_optimizer, make_train_step
from tests.fixtures.chat.qwen3_tokenizer import qwen3_tokenizer_dir
from tests.rollout.conftest import tiny_qwen3


@pytest.fixture(scope="module")
def tokenizer() -> Tokenizer:
    return Tokenizer.from_pretrained(qwen3_tokenizer_dir())


def last_observation_only(messages):
    """A context view that keeps only the latest tool output (as the GUI recipe keeps one screenshot)."""
    last = max((i for i, m in enumerate(messages) if m.role == "tool"), default=-1)
    return [m.model_copy(update={"content": "(earlier output)"}) if m.role == "tool" and i != last else m
            for i, m in enumerate(messages)]


def rollouts(tokenizer, model, count: int, turns: int = 2, view=None) -> list[Trajectory]:
    """Real rollouts: a tiny model samples assistant turns with the JAX engine, each turn's prompt
    rendered (through ``view``) and recorded as a policy records it."""
    chat, engine = Qwen3Format(tokenizer), JaxEngine(model, tokenizer)
    out = []
    for seed in range(count):
        messages = [Message(role="user", content="Fix the bug.")]
        for turn in range(turns):
            shown = messages if view is None else view(messages)
            prompt = chat.render([m.to_chat() for m in shown], add_generation_prompt=True).token_ids
            [done] = engine.generate([prompt], SamplingParams(max_tokens=6, temperature=1.0, seed=seed * 10 + turn))
            messages += [Message(role="assistant", content=done.text, token_ids=done.token_ids, logprobs=done.logprobs,
                                 prompt_tokens=len(prompt), prompt_digest=token_digest(prompt)),
                         Message(role="tool", content=f"observation {turn}")]
        out.append(Trajectory(task_id="t", messages=messages, outcome=Outcome(reward=float(seed % 2))))
    return out


def test_only_sampled_tokens_train_with_their_logprobs(tokenizer):
    [run] = rollouts(tokenizer, tiny_qwen3(seed=0), 1)
    example = trajectory_row(run, 0.5, Qwen3Format(tokenizer))
    trained = [i for i, keep in enumerate(example["loss_mask"]) if keep]
    sampled = [m for m in run.messages if m.role == "assistant"]
    assert [example["token_ids"][i] for i in trained] == sampled[0].token_ids + sampled[1].token_ids
    assert [example["old_logprobs"][i] for i in trained] == sampled[0].logprobs + sampled[1].logprobs
    assert not any(trajectory_row(run, None, Qwen3Format(tokenizer))["loss_mask"])  # a dropped rollout
    # The observation after the last action trains nothing and is not rendered.
    last_action = Qwen3Format(tokenizer).render([m.to_chat() for m in run.messages[:-1]]).token_ids
    assert example["token_ids"] == last_action and run.messages[-1].role == "tool"
    row = pack_rollouts([example], seq_len=128, rows=2, multiple=2)
    targets = row["targets"][0][row["loss_mask"][0] > 0].tolist()
    assert targets == sampled[0].token_ids + sampled[1].token_ids  # shifted onto the predicting position
    assert row["old_logprobs"][0][row["loss_mask"][0] > 0].tolist() == pytest.approx(
        sampled[0].logprobs + sampled[1].logprobs)
    assert row["loss_mask"][1].sum() == 0  # a padding row
    with pytest.raises(ValueError, match="only 1 given"):
        pack_rollouts([example] * 3, seq_len=len(example["token_ids"]), rows=1)
    with pytest.raises(ValueError, match="do not fit"):
        pack_rollouts([example], seq_len=16, rows=4)
    assert len(pack_rollouts([example] * 3, seq_len=len(example["token_ids"]), rows=8, multiple=4)["tokens"]) == 4
    assert len(pack_rollouts([example], seq_len=128, rows=8)["tokens"]) == 1  # no bucket: the rows needed


def test_per_turn_rows_are_each_turn_exactly_as_sampled(tokenizer):
    [run] = rollouts(tokenizer, tiny_qwen3(seed=0), 1, turns=3)
    chat = Qwen3Format(tokenizer)
    rows = policy_rows(run, -1.0, chat, "turn")
    sampled = [m for m in run.messages if m.role == "assistant"]
    assert len(rows) == 3
    for row, message in zip(rows, sampled, strict=True):
        prompt = row["token_ids"][: len(row["token_ids"]) - len(message.token_ids)]
        assert token_digest(prompt) == message.prompt_digest and row["token_ids"][len(prompt):] == message.token_ids
        assert [i for i, keep in enumerate(row["loss_mask"]) if keep] == list(range(len(prompt), len(row["token_ids"])))
        assert row["old_logprobs"][len(prompt):] == message.logprobs and set(row["advantages"]) == {-1.0}
    # The whole conversation is a prefix of itself: the per-trajectory row trains the same tokens once.
    assert sum(map(sum, (r["loss_mask"] for r in rows))) == sum(trajectory_row(run, -1.0, chat)["loss_mask"])


def test_a_row_whose_prompt_is_not_what_was_sampled_fails_loudly(tokenizer):
    chat, model = Qwen3Format(tokenizer), tiny_qwen3(seed=0)
    [viewed] = rollouts(tokenizer, model, 1, turns=3, view=last_observation_only)
    # Its turns are not prefixes of each other: a per-trajectory row would train on a context never seen.
    with pytest.raises(PromptMismatch, match="turn 2: the row's prompt"):
        trajectory_row(viewed, 1.0, chat)
    with pytest.raises(PromptMismatch):
        turn_rows(viewed, 1.0, chat)  # rendered without the policy's view
    assert len(turn_rows(viewed, 1.0, chat, view=last_observation_only)) == 3  # with it: each turn as sampled
    with pytest.raises(ValueError, match="build rows per turn"):
        policy_rows(viewed, 1.0, chat, "trajectory", view=last_observation_only)
    # An observation edited after it was sampled from is caught in either shape.
    [run] = rollouts(tokenizer, model, 1)
    edited = run.model_copy(update={"messages": [*run.messages[:2], run.messages[2].model_copy(
        update={"content": "a forged observation"}), *run.messages[3:]]})
    for shape in ("trajectory", "turn"):
        with pytest.raises(PromptMismatch, match="turn 1"):
            policy_rows(edited, 1.0, chat, shape)
    # A turn sampled without a record of its prompt cannot be checked, so RL will not train on it.
    unrecorded = run.model_copy(update={"messages": [m.model_copy(update={"prompt_tokens": None, "prompt_digest": None})
                                                     for m in run.messages]})
    with pytest.raises(PromptMismatch, match="without a record of its prompt"):
        trajectory_row(unrecorded, 1.0, chat)


def test_a_grpo_step_on_fresh_rollouts_starts_at_ratio_one(tokenizer):
    """Old logprobs from the engine equal the learner's own, so the first loss is -mean(advantage)."""
    model = tiny_qwen3(seed=0)
    runs = rollouts(tokenizer, model, 4)
    advantages = group_advantages([r.outcome.reward for r in runs])
    chat = Qwen3Format(tokenizer)
    examples = [trajectory_row(r, a, chat) for r, a in zip(runs, advantages, strict=True)]
    batch = pack_rollouts(examples, seq_len=128, rows=4)
    mesh = make_mesh(1, 1)
    optimizer, schedule = make_optimizer(OptimConfig(1e-3, 1e-4, 1), 10)
    graphdef, state = init_state(model, optimizer, mesh)
    step = make_train_step(graphdef, optimizer, schedule, loss_fn=make_policy_loss())
    _, metrics = step(state, jax.device_put({k: v[None] for k, v in batch.items()}, batch_sharding(mesh)))
    trained = batch["loss_mask"] > 0
    expected = -float(np.sum(batch["advantages"][trained])) / trained.sum()
    assert float(metrics["loss"]) == pytest.approx(expected, abs=1e-4)
    assert float(metrics["tokens"]) == trained.sum() == sum(len(m.token_ids) for r in runs for m in r.messages
                                                            if m.role == "assistant")


def recorded_call(number: int, prompt: list[int], ids: list[int], usable: bool = True) -> dict:
    return {"session": "s", "call": number, "status": "ok" if usable else "client_disconnected",
            "usable_for_rl": usable, "prompt_token_ids": [prompt],
            "completions": [{"token_ids": ids, "logprobs": [-0.1 * (i + 1) for i in range(len(ids))]}]}


def test_recorded_calls_merge_while_each_prompt_extends_the_last_row():
    calls = [recorded_call(1, [1, 2, 3], [4, 5]), recorded_call(2, [1, 2, 3, 4, 5, 6, 7], [8]),
             recorded_call(3, [9], [10, 11])]  # the third call's prompt starts afresh: a row of its own
    first, second = recorded_rows(calls, 0.5)
    assert first["token_ids"] == [1, 2, 3, 4, 5, 6, 7, 8]
    assert first["loss_mask"] == [False, False, False, True, True, False, False, True]  # 6, 7: the observation
    assert first["old_logprobs"] == pytest.approx([0, 0, 0, -0.1, -0.2, 0, 0, -0.1])
    assert second["token_ids"] == [9, 10, 11] and second["loss_mask"] == [False, True, True]
    assert set(first["advantages"]) == {0.5} and len(first["advantages"]) == 8
    assert not any(recorded_rows(calls, None)[0]["loss_mask"])  # a dropped rollout trains nothing
    with pytest.raises(ValueError, match="not usable for RL"):
        recorded_rows([*calls, recorded_call(4, [9, 10, 11], [12], usable=False)], 0.5)


@pytest.mark.slow
async def test_the_learner_recomputes_the_logprobs_the_proxy_recorded(policy_server, random_policy, tmp_path):
    from orchard.models.weights import from_pretrained
    from orchard.rollout.proxy import ProxyConfig, RecordingProxy, SessionRequest
    from orchard.rollout.proxy_records import read_session
    from orchard.train.state import target_logprobs

    proxy = RecordingProxy(ProxyConfig(policy_server.url, str(tmp_path)))
    session = proxy.open(SessionRequest(task="t", harness="h", sampling={"temperature": 1.0, "seed": 3,
                                                                          "max_tokens": 12}))
    messages = [{"role": "user", "content": "Name a colour."}]
    first = await proxy.forward(session, "/v1/chat/completions", {"model": "x", "messages": messages})
    messages += [first["choices"][0]["message"], {"role": "user", "content": "And another one?"}]
    await proxy.forward(session, "/v1/chat/completions", {"model": "x", "messages": messages})
    proxy.close(session)
    await proxy.client.aclose()
    rows = recorded_rows(read_session(session.path).calls, 1.0)
    model = from_pretrained(random_policy, dtype="float32")
    differences = []
    for row in rows:
        tokens = np.asarray(row["token_ids"])[None]
        logits = model(tokens, np.arange(tokens.shape[1])[None], np.ones_like(tokens))
        learner = np.asarray(target_logprobs(logits[:, :-1], tokens[:, 1:]))[0]
        trained = [i for i, m in enumerate(row["loss_mask"]) if m]
        differences += [abs(learner[i - 1] - row["old_logprobs"][i]) for i in trained]
    print(f"recorded vs learner logprobs: {len(rows)} rows, {len(differences)} tokens, mean |diff| {np.mean(differences):.2e}")
    assert len(differences) >= 2 and float(np.mean(differences)) < 1e-3, np.mean(differences)
