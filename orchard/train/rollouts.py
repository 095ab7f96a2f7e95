"""Rollouts to GRPO training rows: sampled tokens, their old logprobs and their advantage.

A rollout is a :class:`~orchard.data.trajectory.Trajectory` whose assistant messages carry the
token ids and logprobs the engine sampled. It is rendered with the chat format (sampled ids are
used as they are), and only those sampled tokens carry loss; every one of them gets the
trajectory's advantage. Rows are packed like SFT rows (:func:`orchard.data.pipeline.pack`), with
``old_logprobs`` and ``advantages`` as extra per-token features.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from orchard.data.chat import ChatMLFormat, Source
from orchard.data.pipeline import pack
from orchard.data.trajectory import Trajectory

FEATURES = ("old_logprobs", "advantages")


def policy_example(trajectory: Trajectory, advantage: float | None, chat_format: ChatMLFormat) -> dict[str, list]:
    """Token ids, loss mask, old logprobs and advantages of one rollout; ``advantage=None`` (a
    dropped rollout) gives an all-zero loss mask."""
    messages = list(trajectory.messages)
    while messages and messages[-1].role != "assistant":
        messages.pop()  # what came after the last action (its output, a submission) trains nothing
    rendered = chat_format.render([m.to_chat() for m in messages], tools=trajectory.tools)
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


def pack_rollouts(examples: Sequence[dict[str, list]], seq_len: int, rows: int) -> dict[str, np.ndarray]:
    """Pack rollouts into exactly ``rows`` rows of ``seq_len`` (padding rows when fewer are needed).

    Raises ``ValueError`` if a rollout is longer than a row or they need more rows: the RL config
    must give the learner room for a whole step's rollouts, or the step would silently drop some.
    """
    if too_long := [len(e["token_ids"]) for e in examples if len(e["token_ids"]) > seq_len + 1]:
        raise ValueError(f"rollouts of {max(too_long)} tokens do not fit rows of {seq_len}: raise the learner's "
                         "seq_len or lower the rollouts' token limit")
    packed = pack(examples, seq_len, num_packing_bins=max(rows, 1), features=FEATURES)
    if len(packed) > rows:
        raise ValueError(f"{len(examples)} rollouts need {len(packed)} rows of {seq_len} tokens; only {rows} given")
    empty = {k: np.zeros_like(v) for k, v in packed[0].items()} if packed else None
    if empty is None:
        raise ValueError("no rollouts to pack")
    packed += [empty] * (rows - len(packed))
    return {k: np.stack([row[k] for row in packed]) for k in packed[0]}
