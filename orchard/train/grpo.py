"""GRPO: group-relative advantages and the token-level clipped policy loss.

Each rollout's advantage is ``(r - mean(group)) / std(group)`` (population std); a group whose
rewards are all equal gets zero advantages. The advantage is broadcast to every assistant token of
the trajectory; only those tokens carry loss. The loss is PPO's clipped surrogate with asymmetric
clipping (``eps_low`` 0.2, ``eps_high`` 0.28, as in the paper and DAPO), averaged over tokens,
with no KL and no entropy term. Old logprobs are those the rollout engine reported when sampling.
A rollout whose reward is ``None`` (judge failure, wall-clock abort) is dropped: its tokens get a
zero loss mask.

The learner reuses the SFT trainer's state, mesh, optimizer, step and checkpoints
(:mod:`orchard.train.state`): :func:`make_policy_loss` is the ``loss_fn`` of ``make_train_step``.
"""

from __future__ import annotations

from collections.abc import Sequence
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


def make_policy_loss(eps_low: float = EPS_LOW, eps_high: float = EPS_HIGH, image_grid: Grid | None = None):
    """``loss(graphdef, params, batch) -> (summed loss, tokens)`` for packed rollout batches with
    ``tokens, targets, positions, segment_ids, loss_mask, old_logprobs, advantages`` (and, with
    ``image_grid``, their images: :func:`orchard.train.images.attach_images`)."""

    def loss(graphdef: Any, params: Any, batch: dict[str, jax.Array]) -> tuple[jax.Array, jax.Array]:
        logprobs = batch_target_logprobs(nnx.merge(graphdef, params), batch, image_grid)
        ratio = jnp.exp(logprobs - batch["old_logprobs"])
        advantages = batch["advantages"]
        clipped = jnp.clip(ratio, 1.0 - eps_low, 1.0 + eps_high)
        surrogate = jnp.minimum(ratio * advantages, clipped * advantages)
        mask = batch["loss_mask"].astype(jnp.float32)
        return -jnp.sum(surrogate * mask), jnp.sum(mask)

    return loss
