"""The copy probe: which positions only copying predicts, and a policy's greedy accuracy there."""

from __future__ import annotations

import jax.numpy as jnp
import pytest

from orchard.eval.copying import ProbeRow, copy_accuracy, novel_tokens, probe_positions

VOCAB = 40


def induction_model(tokens: jnp.ndarray) -> jnp.ndarray:
    """Logits that predict, at each position, the token that followed the last earlier occurrence of the current
    token (token 0 where there is none): a perfect induction head."""
    t = tokens.shape[1]
    at = jnp.arange(t)
    earlier = (tokens[:, :, None] == tokens[:, None, :]) & (at[None, :, None] > at[None, None, :])  # [B, T, S]
    last = jnp.max(jnp.where(earlier, at[None, None, :], -1), axis=-1)  # [B, T]
    following = jnp.take_along_axis(tokens, jnp.clip(last + 1, 0, t - 1), axis=1)
    return jax_one_hot(jnp.where(last >= 0, following, 0))


def jax_one_hot(ids: jnp.ndarray) -> jnp.ndarray:
    return (ids[..., None] == jnp.arange(VOCAB)).astype(jnp.float32)


# A prompt naming "11 12 13" (a name's pieces), then an action that writes "9 11 12 13" again: after 11 and 12
# the name's next piece is copyable; 9 and 11 are not (no earlier pair predicts them).
ROW = ProbeRow(token_ids=[1, 2, 9, 11, 12, 13, 3, 4, 5, 9, 11, 12, 13, 6],
               loss_mask=[0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1], novel=frozenset({12, 13}))


def test_positions_are_trained_tokens_whose_pair_came_before_and_novel_ones_are_new_names():
    positions = probe_positions(ROW)
    assert positions["actions"] == [9, 10, 11, 12, 13]
    assert positions["copyable"] == [10, 11, 12]  # (9, 11), (11, 12), (12, 13) occurred at 2-5
    assert positions["novel"] == [11, 12]  # 12 and 13 are new; 11 is not


def test_an_induction_head_copies_every_copyable_token_and_a_constant_policy_none():
    copier = copy_accuracy(induction_model, [ROW, ROW], seq_len=16)
    assert copier.copyable == copier.novel == 1.0 and copier.counts == {"actions": 10, "copyable": 6, "novel": 4}
    assert copier.actions == pytest.approx(6 / 10)  # 9 follows 5 once, never before; 6 follows 13 nowhere earlier
    constant = copy_accuracy(lambda tokens: jax_one_hot(jnp.zeros_like(tokens)), [ROW], seq_len=16)
    assert constant.actions == constant.copyable == constant.novel == 0.0


def test_rows_are_cut_to_the_probe_length():
    cut = copy_accuracy(induction_model, [ROW], seq_len=12)  # positions 12 and 13 are cut
    assert cut.counts == {"actions": 3, "copyable": 2, "novel": 1}


def test_novel_tokens_are_the_ones_the_original_never_held():
    assert novel_tokens([1, 5, 7, 7, 9], [1, 2, 9]) == frozenset({5, 7})
