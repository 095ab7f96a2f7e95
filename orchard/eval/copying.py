"""Does a policy copy? Teacher-forced accuracy where only copying predicts the next token.

A held-out resolve rate of 0 does not say why. An agent copies at every step (the failing test's name
from pytest's output into ``grep``, the path from a traceback into an edit), and a policy trained on a few
hundred runs can instead recall the names it has seen there. This probe reads runs whose names were coined
anew (:func:`orchard.tasks.swe.skills.renamed_runs` with copy indices no SFT row used), so recall cannot
help, and scores the policy's greedy next token, teacher-forced, at three sets of positions of their trained
action tokens:

* ``actions``: all of them;
* ``copyable``: those whose (previous, next) token pair occurred earlier in the row, which an induction head
  (find the earlier occurrence of the current token, emit what followed it) predicts;
* ``novel``: the copyable ones whose token the run held nowhere before it was renamed: the pieces of the
  coined names, which only copying predicts.

No episode is run: a few dozen forward passes, seconds on a CPU.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass

import jax
import jax.numpy as jnp
import numpy as np

from orchard.models.transformer import Transformer

POSITIONS = ("actions", "copyable", "novel")


@dataclass(frozen=True)
class ProbeRow:
    """One renamed run's tokens, the loss weight of each (1: a trained action token), and the tokens that its
    original held nowhere (the new names' pieces)."""

    token_ids: list[int]
    loss_mask: list[float]
    novel: frozenset[int]


@dataclass(frozen=True)
class CopyProbe:
    """Greedy next-token accuracy at each kind of position (:data:`POSITIONS`), and how many positions each had."""

    actions: float
    copyable: float
    novel: float
    counts: dict[str, int]

    def to_dict(self) -> dict:
        return asdict(self)


def probe_positions(row: ProbeRow) -> dict[str, list[int]]:
    """The indices ``j`` (a target token ``row.token_ids[j]``, predicted from the tokens before it) of each
    kind of position in ``row``."""
    ids, seen = row.token_ids, set()
    positions: dict[str, list[int]] = {name: [] for name in POSITIONS}
    for j in range(1, len(ids)):
        pair = (ids[j - 1], ids[j])
        if row.loss_mask[j] >= 1:
            positions["actions"].append(j)
            if pair in seen and ids[j - 1] != ids[j]:
                positions["copyable"].append(j)
                if ids[j] in row.novel:
                    positions["novel"].append(j)
        seen.add(pair)
    return positions


def copy_accuracy(model: Transformer, rows: Iterable[ProbeRow], seq_len: int) -> CopyProbe:
    """:class:`CopyProbe` of ``model`` over ``rows``, each cut to ``seq_len`` tokens (one compiled shape)."""
    forward = jax.jit(lambda tokens: jnp.argmax(model(tokens), axis=-1))
    hits = {name: 0 for name in POSITIONS}
    counts = {name: 0 for name in POSITIONS}
    for row in rows:
        ids = row.token_ids[:seq_len]
        row = ProbeRow(ids, row.loss_mask[:seq_len], row.novel)
        predicted = np.asarray(forward(jnp.asarray([ids + [0] * (seq_len - len(ids))], jnp.int32)))[0]
        for name, indices in probe_positions(row).items():
            counts[name] += len(indices)
            hits[name] += sum(int(predicted[j - 1] == ids[j]) for j in indices)
    return CopyProbe(**{name: hits[name] / counts[name] if counts[name] else 0.0 for name in POSITIONS},
                     counts=counts)


def novel_tokens(renamed: Sequence[int], original: Sequence[int]) -> frozenset[int]:
    """The tokens of a renamed run's row that its original's row holds nowhere."""
    return frozenset(renamed) - frozenset(original)
