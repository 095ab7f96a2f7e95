"""Rollouts to GRPO training rows: sampled tokens, their old logprobs and their advantage.

A rollout is a :class:`~orchard.data.trajectory.Trajectory` whose assistant messages carry the
token ids and logprobs the engine sampled, and the prompt each was sampled under. Only the sampled
tokens carry loss, and every one of them gets the trajectory's advantage. Rows come in two shapes
(``rows_per``):

* ``trajectory``: the whole conversation in one row (up to its last assistant turn), rendered
  with the chat format, sampled ids used as they are; each turn's prefix is checked against the
  prompt it was sampled under. This is what a policy that shows the whole conversation samples.
* ``turn``: one row per assistant turn, the exact prompt that turn was sampled under followed by
  its sampled ids. A policy whose context ``view`` drops earlier messages (the GUI recipe keeps
  only the latest screenshot) samples turns that are not prefixes of one another: only these rows
  train on what it saw.

Rollouts of harnesses Orchard does not control come as the recording proxy's calls instead
(:func:`recorded_rows`): the upstream's own ids, merged into one row while each call's prompt
extends the previous one.

A row whose prompt differs from the sampled one, token for token, is a
:class:`~orchard.data.examples.PromptMismatch`. Rows are packed like SFT rows
(:func:`orchard.data.pipeline.pack`), with ``old_logprobs`` and ``advantages`` as extra per-token
features.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Literal

import numpy as np

from orchard.data.chat import ChatFormat, Source
from orchard.data.examples import (
    ContextView,
    RecordedTurn,
    merge_recorded,
    recorded_turns,
    render_sampled,
    sampled_turns,
)
from orchard.data.pipeline import pack
from orchard.data.trajectory import Trajectory
from orchard.data.vision_rows import ImageTable

FEATURES = ("old_logprobs", "advantages")
RowsPer = Literal["trajectory", "turn"]
Row = dict[str, list]


def trajectory_row(trajectory: Trajectory, advantage: float | None, chat_format: ChatFormat) -> Row:
    """Token ids, loss mask, old logprobs and advantages of one rollout in one row; ``advantage=None``
    (a dropped rollout) gives an all-zero loss mask."""
    messages = list(trajectory.messages)
    while messages and messages[-1].role != "assistant":
        messages.pop()  # what came after the last action (its output, a submission) trains nothing
    rendered = render_sampled(trajectory, chat_format, messages, require_prompts=True)
    size = len(rendered.token_ids)
    mask, old = [False] * size, [0.0] * size
    sampled = [m for m in messages if m.role == "assistant"]
    spans = [(start, end) for role, start, end in rendered.spans if role == "assistant"]
    for message, (start, end) in zip(sampled, spans, strict=True):
        if message.logprobs is None:
            continue  # not sampled by this policy (e.g. a teacher's text): no policy-gradient signal
        positions = [i for i in range(start, end) if rendered.sources[i] is Source.ASSISTANT]
        if [rendered.token_ids[i] for i in positions] != message.token_ids:
            raise ValueError(f"rollout {trajectory.id}: rendered ids differ from the sampled ones")
        for i, logprob in zip(positions, message.logprobs, strict=True):
            mask[i], old[i] = advantage is not None, logprob
    value = 0.0 if advantage is None else advantage
    return {"token_ids": rendered.token_ids, "loss_mask": mask, "old_logprobs": old, "advantages": [value] * size}


def turn_rows(trajectory: Trajectory, advantage: float | None, chat_format: ChatFormat,
              view: ContextView | None = None, images: ImageTable | None = None) -> list[Row]:
    """One row per sampled assistant turn: its prompt (rendered through ``view``, checked), then its ids.
    A prompt that shows images adds their features (:mod:`orchard.data.vision_rows`) from ``images``."""
    rows = []
    for turn in sampled_turns(trajectory, chat_format, view):
        ids, logprobs = list(turn.message.token_ids or ()), list(turn.message.logprobs or ())
        if len(logprobs) != len(ids):
            continue  # no logprobs recorded: no policy-gradient signal
        size = len(turn.prompt) + len(ids)
        mask = [False] * len(turn.prompt) + [advantage is not None] * len(ids)
        value = 0.0 if advantage is None else advantage
        row = {"token_ids": turn.prompt + ids, "loss_mask": mask,
               "old_logprobs": [0.0] * len(turn.prompt) + logprobs, "advantages": [value] * size}
        if images is not None:
            row.update(images.features(row["token_ids"], turn.images))
        elif turn.images:
            raise ValueError(f"rollout {trajectory.id}: its prompts show images; rows need an ImageTable")
        rows.append(row)
    return rows


def recorded_rows(calls: Sequence[Mapping[str, Any]], advantage: float | None, choice: int = 0) -> list[Row]:
    """Rows of one rollout recorded by the proxy (:mod:`orchard.rollout.proxy`), from its calls in order.

    Each call is its prompt ids (no loss) and its completion ids (loss; the recorded logprobs are the
    old logprobs; the rollout's ``advantage`` on every token), merged as
    :func:`~orchard.data.examples.merge_recorded` merges them. A call the proxy marked unusable for
    RL (no ids or logprobs came back, the client disconnected, the deadline passed) is an error.
    """
    for call in calls:
        if not call.get("usable_for_rl"):
            raise ValueError(f"call {call.get('call')} of session {call.get('session')} is not usable for RL "
                             f"(status {call.get('status')!r}): its rollout cannot be trained on")
    turns = [RecordedTurn(call["prompt_token_ids"][choice], call["completions"][choice]["token_ids"],
                          call["completions"][choice]["logprobs"]) for call in calls]
    return _grpo_rows(turns, advantage)


def _grpo_rows(turns: Sequence[RecordedTurn], advantage: float | None) -> list[Row]:
    return [{"token_ids": row.token_ids, "loss_mask": [advantage is not None and turn >= 0 for turn in row.turns],
             "old_logprobs": row.logprobs, "advantages": [0.0 if advantage is None else advantage] * len(row.token_ids)}
            for row in merge_recorded(turns)]


def policy_rows(trajectory: Trajectory, advantage: float | None, chat_format: ChatFormat, rows_per: RowsPer,
                view: ContextView | None = None, images: ImageTable | None = None) -> list[Row]:
    """The rows of one rollout, in the shape ``rows_per`` names (see the module docstring). A rollout
    recorded by the proxy (an external harness: ``metadata["recorded_prompt_ids"]``) is its recorded
    calls' rows, whatever ``rows_per`` says: its ids are the upstream's, never re-rendered."""
    if (turns := recorded_turns(trajectory)) is not None:
        return _grpo_rows(turns, advantage)
    if rows_per == "trajectory":
        if view is not None:
            raise ValueError("a context view shows each turn its own prompt: build rows per turn")
        return [trajectory_row(trajectory, advantage, chat_format)]
    if rows_per == "turn":
        return turn_rows(trajectory, advantage, chat_format, view, images)
    raise ValueError(f"rows_per must be 'trajectory' or 'turn', not {rows_per!r}")


def pack_rollouts(examples: Sequence[Row], seq_len: int, rows: int, multiple: int = 1,
                  inputs: Sequence[str] = ()) -> dict[str, np.ndarray]:
    """Pack rollouts into rows of ``seq_len``, at most ``rows`` of them, padded with empty rows up to a
    multiple of ``multiple`` (so a learner compiles one program per bucket, not per count, and
    computes no more empty rows than the bucket needs).

    Raises ``ValueError`` if a rollout is longer than a row or they need more rows: the RL config
    must give the learner room for a whole step's rollouts, or the step would silently drop some.
    ``inputs``: per-token fields aligned with the input tokens (a VLM's image features).
    """
    if too_long := [len(e["token_ids"]) for e in examples if len(e["token_ids"]) > seq_len + 1]:
        raise ValueError(f"rollouts of {max(too_long)} tokens do not fit rows of {seq_len}: raise the learner's "
                         "seq_len or lower the rollouts' token limit")
    if multiple < 1 or rows % multiple:
        raise ValueError(f"rows ({rows}) must be a multiple of the row bucket ({multiple})")
    packed = pack(examples, seq_len, num_packing_bins=max(rows, 1), features=FEATURES, inputs=inputs)
    if len(packed) > rows:
        raise ValueError(f"{len(examples)} rollouts need {len(packed)} rows of {seq_len} tokens; only {rows} given")
    if not packed:
        raise ValueError("no rollouts to pack")
    empty = {k: np.zeros_like(v) for k, v in packed[0].items()}
    packed += [empty] * (-len(packed) % multiple)
    return {k: np.stack([row[k] for row in packed]) for k in packed[0]}
