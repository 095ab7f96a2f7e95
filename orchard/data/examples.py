"""Training examples from trajectories: token ids plus the loss weights of credit-assignment SFT.

Assistant action tokens carry loss (the sources of :mod:`orchard.data.chat`): a resolved
trajectory trains on all its actions, an unresolved one only on the actions inside its rise
segments (:mod:`orchard.data.rise`), so failed actions are never taught while the progress made
before them is. In the paper the rest (system, user, tool and template tokens) carries none; that
is ``observation_weight=0``, the default. A model trained from scratch may also learn to predict
what it is shown, at a smaller weight: tool output is where it sees names copied and code
written (a departure from the paper, for ``configs/swe_bar.py:tiny``). An action left out of the
rise segments stays at 0 whatever the weight. Recorded token ids are used where a trajectory has
them; other turns are rendered with the chat format.
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
    loss_mask: list[float]  # the loss weight of each token: 1 for a taught action, 0 for none

    def to_record(self) -> dict:
        return {"token_ids": self.token_ids, "loss_mask": [m if 0 < m < 1 else int(m) for m in self.loss_mask]}


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


def to_example(trajectory: Trajectory, chat_format: ChatMLFormat, observation_weight: float = 0.0) -> Example:
    """The example of one trajectory; ``observation_weight`` is the weight of every token that is
    not an assistant's (see the module docstring)."""
    if not 0.0 <= observation_weight <= 1.0:
        raise ValueError(f"observation_weight must be in [0, 1], not {observation_weight}")
    rendered = chat_format.render([m.to_chat() for m in trajectory.messages], tools=trajectory.tools)
    weights = [1.0 if taught else observation_weight for taught in rendered.loss_mask()]
    keep = trained_actions(trajectory)
    assistant_spans = [(start, end) for role, start, end in rendered.spans if role == "assistant"]
    for action, (start, end) in enumerate(assistant_spans):
        if action not in keep:
            weights[start:end] = [0.0] * (end - start)
    return Example(rendered.token_ids, weights)


def write_examples(trajectories: Iterable[Trajectory], chat_format: ChatMLFormat, path: str,
                   observation_weight: float = 0.0) -> int:
    """Write the examples of ``trajectories`` as JSONL for :mod:`orchard.data.pipeline`; returns how
    many were written (an example with no trained token is skipped: it teaches nothing)."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    written = 0
    with open(path + ".tmp", "w") as handle:
        for trajectory in trajectories:
            example = to_example(trajectory, chat_format, observation_weight)
            if any(example.loss_mask):
                handle.write(json.dumps(example.to_record()) + "\n")
                written += 1
    os.replace(path + ".tmp", path)
    return written
