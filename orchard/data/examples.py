"""Training examples from trajectories: token ids plus the loss mask of credit-assignment SFT.

Only assistant action tokens carry loss (the sources of :mod:`orchard.data.chat`); system, user,
tool and template tokens never do. A resolved trajectory trains on all its actions; an unresolved
one only on the actions inside its rise segments (:mod:`orchard.data.rise`), so failed actions are
never taught while the progress made before them is. Recorded token ids are used where a
trajectory has them; other turns are rendered with the chat format.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from dataclasses import dataclass

from orchard.data.chat import ChatMLFormat
from orchard.data.rise import rise_segments
from orchard.data.trajectory import Trajectory


@dataclass
class Example:
    token_ids: list[int]
    loss_mask: list[bool]

    def to_record(self) -> dict:
        return {"token_ids": self.token_ids, "loss_mask": [int(m) for m in self.loss_mask]}


def trained_actions(trajectory: Trajectory) -> set[int]:
    """The action indices whose tokens carry loss."""
    if trajectory.outcome.resolved:
        return set(range(trajectory.num_actions))
    segments = trajectory.rise_segments
    if segments is None:
        if trajectory.values is None:
            raise ValueError(f"trajectory {trajectory.id} is unresolved and has neither values nor rise segments: "
                             "annotate it with orchard.data.rise.annotate first")
        segments = rise_segments(trajectory.values)
    return {t for first, last in segments for t in range(first, last + 1)}


def to_example(trajectory: Trajectory, chat_format: ChatMLFormat) -> Example:
    rendered = chat_format.render([m.to_chat() for m in trajectory.messages], tools=trajectory.tools)
    mask = rendered.loss_mask()
    keep = trained_actions(trajectory)
    assistant_spans = [(start, end) for role, start, end in rendered.spans if role == "assistant"]
    for action, (start, end) in enumerate(assistant_spans):
        if action not in keep:
            mask[start:end] = [False] * (end - start)
    return Example(rendered.token_ids, mask)


def write_examples(trajectories: Iterable[Trajectory], chat_format: ChatMLFormat, path: str) -> int:
    """Write the examples of ``trajectories`` as JSONL for :mod:`orchard.data.pipeline`; returns how
    many were written (an example with no trained token is skipped: it teaches nothing)."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    written = 0
    with open(path + ".tmp", "w") as handle:
        for trajectory in trajectories:
            example = to_example(trajectory, chat_format)
            if any(example.loss_mask):
                handle.write(json.dumps(example.to_record()) + "\n")
                written += 1
    os.replace(path + ".tmp", path)
    return written
