"""GRPO: group-relative advantages and the token-level clipped policy loss.

Each rollout's advantage is ``(r - mean(group)) / std(group)`` (population std); a group whose
rewards are all equal gets zero advantages. The advantage is broadcast to every assistant token of
the trajectory; only those tokens carry loss. The loss is PPO's clipped surrogate with asymmetric
clipping (``eps_low`` 0.2, ``eps_high`` 0.28, as in the paper and DAPO), averaged over tokens,
with no entropy term and, by default, no KL term (the paper's). With ``kl_coef > 0`` the loss adds
``kl_coef`` times the k3 estimate of the KL to the policy RL started from, per token (GRPO's and
verl's ``use_kl_loss``), from the update batch's ``ref_logprobs``. Old logprobs are those the rollout engine reported when sampling.
A rollout whose reward is ``None`` (judge failure, wall-clock abort) is dropped: its tokens get a
zero loss mask.

The loss can also report diagnostics, only logged, never trained on (:func:`policy_diagnostics`):
how far the update moved from the policy that sampled (clip fraction, KL to the behaviour policy),
from the policy RL started from (KL to the start policy, from reference logprobs that
:func:`make_reference_logprobs` computes once per update batch), and the sampled tokens' entropy.

The learner reuses the SFT trainer's state, mesh, optimizer, step and checkpoints
(:mod:`orchard.train.state`): :func:`make_policy_loss` is the ``loss_fn`` of ``make_train_step``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from orchard.models.vision import Grid
from orchard.train.state import batch_target_logprobs

EPS_LOW, EPS_HIGH = 0.2, 0.28


def group_advantages(rewards: Sequence[float | None]) -> list[float | None]:
    """``(r - mean) / std`` over the group's scored rollouts; ``None`` stays ``None`` (dropped)."""
    scored = np.asarray([r for r in rewards if r is not None], np.float64)
    if scored.size == 0:
        return [None] * len(rewards)
    mean, std = scored.mean(), scored.std()
    return [None if r is None else (0.0 if std < 1e-8 else float((r - mean) / std)) for r in rewards]


def k3(d: jax.Array) -> jax.Array:
    """Schulman's k3 KL estimator per token, ``exp(d) - d - 1`` with ``d = log p_ref(x) - log p(x)``: an
    unbiased, never negative estimate of ``KL(p || p_ref)`` for ``x`` drawn from ``p``, zero where the
    two agree."""
    return jnp.exp(d) - d - 1.0


def policy_diagnostics(logprobs: jax.Array, batch: dict[str, jax.Array], eps_low: float = EPS_LOW,
                       eps_high: float = EPS_HIGH) -> dict[str, jax.Array]:
    """Sums over the trained tokens (``loss_mask``) of a batch whose target logprobs under the current
    parameters are ``logprobs``; divided by the trained-token count they are per-token means:

    * ``clip_fraction``: the share whose ratio ``exp(logprobs - old_logprobs)`` lies outside
      ``[1 - eps_low, 1 + eps_high]`` (where the clipped surrogate may cut the gradient);
    * ``kl_to_behaviour``: k3 with ``d = logprobs - old_logprobs``, KL(behaviour || current) over tokens the
      behaviour policy sampled, so unbiased at every update (0 at a step's first update when the engine's
      logprobs are the learner's);
    * ``sampled_token_entropy``: ``-old_logprobs``. With on-policy sampling at temperature 1 the tokens
      are draws from the policy itself, so its mean is an unbiased estimate of the policy's per-token
      entropy (no full-vocabulary entropy is computed); at any other temperature the tokens come from
      the tempered distribution and the estimate is biased;
    * ``kl_to_start``, when the batch has ``ref_logprobs`` (the tokens' logprobs under the parameters RL
      started from): k3 with ``d = ref_logprobs - logprobs``, the KL to the start (SFT) policy.

    ``kl_to_start`` takes the sampled tokens as draws from the current policy: exact at the first update of
    a step with an on-policy engine, an approximation after it. None of them carries gradient."""
    logprobs = jax.lax.stop_gradient(logprobs)
    mask = batch["loss_mask"].astype(jnp.float32)
    old = batch["old_logprobs"].astype(jnp.float32)
    ratio = jnp.exp(logprobs - old)
    outside = (ratio < 1.0 - eps_low) | (ratio > 1.0 + eps_high)
    sums = {"clip_fraction": jnp.sum(outside * mask),
            "kl_to_behaviour": jnp.sum(k3(logprobs - old) * mask),
            "sampled_token_entropy": jnp.sum(-old * mask)}
    if "ref_logprobs" in batch:
        sums["kl_to_start"] = jnp.sum(k3(batch["ref_logprobs"].astype(jnp.float32) - logprobs) * mask)
    return sums


def make_policy_loss(eps_low: float = EPS_LOW, eps_high: float = EPS_HIGH, image_grid: Grid | None = None,
                     diagnostics: bool = False, kl_coef: float = 0.0):
    """``loss(graphdef, params, batch) -> (summed loss, tokens)`` for packed rollout batches with
    ``tokens, targets, positions, segment_ids, loss_mask, old_logprobs, advantages`` (and, with
    ``image_grid``, their images: :func:`orchard.train.images.attach_images`; with ``kl_coef > 0``,
    ``ref_logprobs``, whose k3 KL to the current logprobs the loss adds at that weight). With ``diagnostics``,
    ``(summed loss, tokens, sums)``: :func:`policy_diagnostics`' sums, which
    :func:`~orchard.train.state.make_train_step` reports as per-token means beside the loss."""

    def loss(graphdef: Any, params: Any, batch: dict[str, jax.Array]) -> tuple:
        logprobs = batch_target_logprobs(nnx.merge(graphdef, params), batch, image_grid)
        ratio = jnp.exp(logprobs - batch["old_logprobs"])
        advantages = batch["advantages"]
        clipped = jnp.clip(ratio, 1.0 - eps_low, 1.0 + eps_high)
        surrogate = jnp.minimum(ratio * advantages, clipped * advantages)
        per_token = -surrogate
        if kl_coef > 0:  # the gradient flows through the current logprobs only
            per_token = per_token + kl_coef * k3(batch["ref_logprobs"].astype(jnp.float32) - logprobs)
        mask = batch["loss_mask"].astype(jnp.float32)
        summed = (jnp.sum(per_token * mask), jnp.sum(mask))
        return (*summed, policy_diagnostics(logprobs, batch, eps_low, eps_high)) if diagnostics else summed

    return loss


def make_reference_logprobs(graphdef: Any, image_grid: Grid | None = None
                            ) -> Callable[[Any, dict[str, jax.Array]], jax.Array]:
    """``ref(params, batch) -> logprobs``: the target logprobs of an update batch (``[micro-batches,
    rows, seq_len]`` arrays, as :func:`~orchard.train.state.make_train_step` takes them) under
    ``params``, one forward pass per micro-batch (no gradient): the ``ref_logprobs`` field that gives
    :func:`policy_diagnostics` its KL to the start policy, computed under the start parameters."""

    def ref(params: Any, batch: dict[str, jax.Array]) -> jax.Array:
        return jax.lax.map(lambda micro: batch_target_logprobs(nnx.merge(graphdef, params), micro, image_grid), batch)

    return jax.jit(ref)
