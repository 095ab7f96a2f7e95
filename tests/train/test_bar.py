"""BAR's group assembly exactly as defined, the baselines, and the GRPO advantages and loss."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from orchard.models import ModelConfig, Transformer
from orchard.train.bar import BAR, DynamicFilter, FixedGroup, assemble_group, top_ranked
from orchard.train.grpo import group_advantages, make_policy_loss, make_reference_logprobs
from orchard.train.state import OptimConfig, TrainState, make_optimizer, make_train_step, token_losses


@dataclass
class R:
    reward: float | None
    status: str = "completed"
    length: int = 10
    name: str = ""


def pool(positives: int, negatives: int) -> list[R]:
    return [R(1.0, name=f"p{i}") for i in range(positives)] + [R(-1.0, name=f"n{i}") for i in range(negatives)]


def test_the_positive_count_is_the_feasible_one_closest_to_the_centre():
    group = assemble_group(pool(10, 10), 8, 0.375, 0.625)
    assert sum(r.reward > 0 for r in group) == 4 and len(group) == 8
    group = assemble_group(pool(3, 10), 8, 0.375, 0.625)  # 4 impossible: 3 is the closest feasible
    assert sum(r.reward > 0 for r in group) == 3
    assert assemble_group(pool(2, 10), 8, 0.375, 0.625) is None  # 2/8 is below the window
    assert assemble_group(pool(8, 0), 8, 0.375, 0.625) is None
    assert sum(r.reward > 0 for r in assemble_group(pool(8, 0), 8, 0.0, 1.0)) == 8
    assert assemble_group(pool(3, 3), 8, 0.0, 1.0) is None  # too few rollouts


def test_within_each_side_completed_come_first_then_shorter():
    rollouts = [R(1.0, "truncated", 1, "pt"), R(1.0, "completed", 50, "pc50"), R(1.0, "completed", 5, "pc5"),
                R(-1.0, "completed", 9, "nc9"), R(-1.0, "truncated", 2, "nt"), R(-1.0, "completed", 3, "nc3"),
                R(-1.0, "aborted", 1, "na"), R(1.0, "timed_out", 1, "pto"), R(None, "completed", 1, "none")]
    group = assemble_group(rollouts, 4, 0.5, 0.5)
    assert [r.name for r in group] == ["pc5", "pc50", "nc3", "nc9"]
    assert [r.name for r in top_ranked(rollouts, 3)] == ["pc5", "pc50", "pt"]
    # The last fallback never admits an aborted or timed-out rollout, however well it scored, nor a dropped one.
    assert [r.name for r in top_ranked(rollouts, 9)] == ["pc5", "pc50", "pt", "nc3", "nc9", "nt"]


def scripted(rewards: list[float]):
    """generate(k) hands out the next k rollouts of a fixed reward sequence, and counts calls."""
    state = {"next": 0, "calls": []}

    async def generate(k: int) -> list[R]:
        state["calls"].append(k)
        out = [R(r, length=state["next"] + i) for i, r in enumerate(rewards[state["next"]: state["next"] + k])]
        state["next"] += k
        return out

    return generate, state


def run(sampler, rewards):
    generate, state = scripted(rewards)
    return asyncio.run(sampler.sample(generate)), state


def test_bar_stops_at_the_first_stride_that_fits():
    result, state = run(BAR(group_size=4, max_budget=12, stride=4, rho_min=0.25, rho_max=0.75),
                        [-1, -1, -1, -1, 1, -1, -1, -1, 1, 1])
    assert state["calls"] == [4, 4] and result.spent == 8 and result.fallback == "none"
    assert sorted(r.reward for r in result.group) == [-1, -1, -1, 1] and result.informative
    assert result.resolved == 1  # positives in everything spent (8 rollouts), not only the chosen 4


def test_bar_falls_back_to_the_relaxed_window_then_to_top_ranked():
    result, state = run(BAR(group_size=4, max_budget=8, stride=4), [-1.0] * 8)
    assert state["calls"] == [4, 4] and result.fallback == "relaxed" and not result.informative
    result, _ = run(BAR(group_size=4, max_budget=4, stride=2), [1.0, None, None, -1.0])
    assert result.fallback == "top_ranked" and [r.reward for r in result.group] == [1.0, -1.0]
    assert result.dropped == 2
    with pytest.raises(ValueError, match="invalid BAR"):
        BAR(group_size=8, max_budget=4)


def test_baselines():
    fixed, _ = run(FixedGroup(4), [1, 1, 1, 1, -1])
    assert fixed.spent == 4 and len(fixed.group) == 4 and not fixed.informative
    dropped, _ = run(DynamicFilter(4), [1, 1, 1, 1])
    assert dropped.group == [] and dropped.spent == 4
    kept, _ = run(DynamicFilter(4), [1, -1, 1, 1])
    assert len(kept.group) == 4 and kept.informative


def test_group_advantages():
    assert group_advantages([1.0, -1.0, 1.0, -1.0]) == [1.0, -1.0, 1.0, -1.0]
    assert group_advantages([1.0, 1.0, 1.0]) == [0.0, 0.0, 0.0]  # no variance, no signal
    advantages = group_advantages([1.0, None, -1.0, -1.0])
    assert advantages[1] is None  # dropped, and left out of the group's statistics
    assert advantages[0] == pytest.approx(np.sqrt(2)) and advantages[2] == advantages[3] == pytest.approx(-np.sqrt(0.5))


def test_the_clipped_loss_pushes_sampled_tokens_by_their_advantage():
    cfg = ModelConfig(model_type="llama", vocab_size=32, hidden_size=16, intermediate_size=32, num_layers=1,
                      num_heads=2, num_kv_heads=1, head_dim=8, dtype="float32")
    graphdef, params = nnx.split(Transformer(cfg, rngs=nnx.Rngs(0)), nnx.Param)
    rng = np.random.default_rng(0)
    tokens = jnp.asarray(rng.integers(0, 32, (2, 8)), jnp.int32)
    batch = {"tokens": tokens, "targets": jnp.roll(tokens, -1, axis=1), "positions": jnp.tile(jnp.arange(8), (2, 1)),
             "segment_ids": jnp.ones((2, 8), jnp.int32), "loss_mask": jnp.ones((2, 8)).at[:, -1].set(0)}
    model = nnx.merge(graphdef, params)
    logp = jnp.take_along_axis(jax.nn.log_softmax(model(tokens), -1), batch["targets"][..., None], -1)[..., 0]
    loss_fn = make_policy_loss()

    def target_logp(p):
        m = nnx.merge(graphdef, p)
        return jnp.take_along_axis(jax.nn.log_softmax(m(tokens), -1), batch["targets"][..., None], -1)[..., 0]

    for sign in (1.0, -1.0):
        signed = {**batch, "old_logprobs": logp, "advantages": jnp.full((2, 8), sign)}
        loss, count = loss_fn(graphdef, params, signed)
        assert float(count) == 14 and float(loss) == pytest.approx(-sign * 14, rel=1e-5)  # ratio 1 at the start
        grads = jax.grad(lambda p, b: loss_fn(graphdef, p, b)[0])(params, signed)
        stepped = jax.tree.map(lambda p, g: p - 0.05 * g, params, grads)
        change = float(jnp.sum((target_logp(stepped) - logp) * batch["loss_mask"]))
        assert change * sign > 0  # positive advantage raises the sampled tokens' logprobs, negative lowers them

    # Outside the clip range on the side the advantage pushes, the gradient vanishes.
    clipped = {**batch, "old_logprobs": logp - 1.0, "advantages": jnp.ones((2, 8))}  # ratio e > 1.28
    grads = jax.grad(lambda p, b: loss_fn(graphdef, p, b)[0])(params, clipped)
    assert all(float(jnp.max(jnp.abs(g))) == 0.0 for g in jax.tree.leaves(grads))
    dropped = {**batch, "old_logprobs": logp, "advantages": jnp.ones((2, 8)), "loss_mask": jnp.zeros((2, 8))}
    assert float(loss_fn(graphdef, params, dropped)[1]) == 0.0


def _policy_batch(rows: int, model_seed: int, data_seed: int, advantages: list[float]):
    """A random one-layer policy, a batch of ``rows`` rows of 10 tokens whose old logprobs put the ratios on
    both sides of both clip bounds (and reference logprobs), and the policy's target logprobs in float64."""
    cfg = ModelConfig(model_type="llama", vocab_size=40, hidden_size=16, intermediate_size=32, num_layers=1,
                      num_heads=2, num_kv_heads=1, head_dim=8, dtype="float32")
    graphdef, params = nnx.split(Transformer(cfg, rngs=nnx.Rngs(model_seed)), nnx.Param)
    rng = np.random.default_rng(data_seed)
    tokens = rng.integers(0, 40, (rows, 10))
    targets = np.roll(tokens, -1, axis=1)
    mask = (rng.random((rows, 10)) < 0.7).astype(np.float32)
    old = rng.normal(-3.7, 0.4, (rows, 10)).astype(np.float32)
    ref = rng.normal(-3.7, 0.3, (rows, 10)).astype(np.float32)
    advantage = np.repeat(group_advantages(advantages), 10).reshape(rows, 10).astype(np.float32)
    batch = {"tokens": jnp.asarray(tokens), "targets": jnp.asarray(targets), "positions": jnp.tile(jnp.arange(10), (rows, 1)),
             "segment_ids": jnp.ones((rows, 10), jnp.int32), "loss_mask": jnp.asarray(mask),
             "old_logprobs": jnp.asarray(old), "advantages": jnp.asarray(advantage), "ref_logprobs": jnp.asarray(ref)}
    logits = np.asarray(nnx.merge(graphdef, params)(jnp.asarray(tokens)), np.float64)
    logp = logits - logits.max(-1, keepdims=True)
    logp = np.take_along_axis(logp - np.log(np.exp(logp).sum(-1, keepdims=True)), targets[..., None], -1)[..., 0]
    return graphdef, params, batch, logp


def test_the_policy_loss_equals_a_numpy_reference():
    graphdef, params, batch, logp = _policy_batch(3, 1, 3, [1.0, -1.0, -1.0])
    mask, old, advantages = (np.asarray(batch[k]) for k in ("loss_mask", "old_logprobs", "advantages"))
    loss, count = make_policy_loss(0.2, 0.28)(graphdef, params, batch)

    ratio = np.exp(logp - old)
    assert (ratio < 0.8).any() and (ratio > 1.28).any()
    surrogate = np.minimum(ratio * advantages, np.clip(ratio, 0.8, 1.28) * advantages)
    assert float(count) == mask.sum()
    assert float(loss) == pytest.approx(-(surrogate * mask).sum(), rel=1e-4)


def test_the_kl_penalty_adds_the_weighted_k3_to_the_start_policy_and_its_gradient_pulls_towards_it():
    graphdef, params, batch, logp = _policy_batch(3, 4, 7, [1.0, -1.0, 0.0])
    mask, old, advantages, ref = (np.asarray(batch[k]) for k in ("loss_mask", "old_logprobs", "advantages",
                                                                  "ref_logprobs"))
    ratio = np.exp(logp - old)
    surrogate = np.minimum(ratio * advantages, np.clip(ratio, 0.8, 1.28) * advantages)
    kl = np.exp(ref - logp) - (ref - logp) - 1
    loss, count = make_policy_loss(0.2, 0.28, kl_coef=0.5)(graphdef, params, batch)
    assert float(count) == mask.sum()
    assert float(loss) == pytest.approx(((-surrogate + 0.5 * kl) * mask).sum(), rel=1e-4)

    # With no advantage to follow, descending the loss lowers the KL to the start policy.
    still = {**batch, "advantages": jnp.zeros_like(batch["advantages"])}
    penalty = make_policy_loss(kl_coef=1.0, diagnostics=True)
    grads = jax.grad(lambda p: penalty(graphdef, p, still)[0])(params)
    moved = jax.tree.map(lambda p, g: p - 0.05 * g, params, grads)
    before, after = (float(penalty(graphdef, p, still)[2]["kl_to_start"]) for p in (params, moved))
    assert after < before


def test_the_policy_diagnostics_equal_a_numpy_reference_and_the_step_averages_them_over_micro_batches():
    graphdef, params, batch, logp = _policy_batch(4, 2, 5, [1.0, -1.0, -1.0, 1.0])
    mask, old, advantages, ref = (np.asarray(batch[k]) for k in ("loss_mask", "old_logprobs", "advantages",
                                                                  "ref_logprobs"))
    ratio = np.exp(logp - old)
    assert ((ratio < 0.8) & (mask > 0)).any() and ((ratio > 1.28) & (mask > 0)).any()
    assert ((ratio > 0.8) & (ratio < 1.28) & (mask > 0)).any()
    trained = mask > 0

    def k3(d):
        return np.exp(d) - d - 1

    expected = {"clip_fraction": np.mean((ratio < 0.8)[trained] | (ratio > 1.28)[trained]),
                "kl_to_behaviour": np.mean(k3(logp - old)[trained]),
                "sampled_token_entropy": np.mean(-old[trained]),
                "kl_to_start": np.mean(k3(ref - logp)[trained])}
    surrogate = np.minimum(ratio * advantages, np.clip(ratio, 0.8, 1.28) * advantages)

    loss, count, sums = make_policy_loss(0.2, 0.28, diagnostics=True)(graphdef, params, batch)
    assert float(count) == mask.sum() and float(loss) == pytest.approx(-(surrogate * mask).sum(), rel=1e-4)
    assert set(sums) == set(expected)
    for name, value in expected.items():
        assert float(sums[name]) / float(count) == pytest.approx(value, rel=1e-4, abs=1e-6), name
    # without ref_logprobs there is no KL to the start; without diagnostics the loss is as it was
    assert "kl_to_start" not in make_policy_loss(diagnostics=True)(
        graphdef, params, {k: v for k, v in batch.items() if k != "ref_logprobs"})[2]
    assert len(make_policy_loss()(graphdef, params, batch)) == 2

    # The step sums them over micro-batches (two of two rows) and divides by all the trained tokens.
    optimizer, schedule = make_optimizer(OptimConfig(), 10)
    micro = {k: v.reshape(2, 2, 10) for k, v in batch.items()}

    def run(loss_fn):
        fresh = jax.tree.map(jnp.copy, params)
        state = TrainState(jnp.zeros((), jnp.int32), fresh, optimizer.init(fresh))
        return jax.device_get(make_train_step(graphdef, optimizer, schedule, loss_fn)(state, micro)[1])

    metrics = run(make_policy_loss(0.2, 0.28, diagnostics=True))
    assert set(metrics) == {"loss", "grad_norm", "lr", "tokens", *expected}
    assert float(metrics["loss"]) == pytest.approx(-(surrogate * mask).sum() / mask.sum(), rel=1e-4)
    for name, value in expected.items():
        assert float(metrics[name]) == pytest.approx(value, rel=1e-4, abs=1e-6), name
    assert set(run(token_losses)) == {"loss", "grad_norm", "lr", "tokens"}  # a (loss, tokens) loss: as before

    # The reference logprobs of an update batch: the target logprobs, micro-batch by micro-batch.
    np.testing.assert_allclose(np.asarray(make_reference_logprobs(graphdef)(params, micro)).reshape(4, 10), logp,
                               rtol=1e-5, atol=1e-5)
