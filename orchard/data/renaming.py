"""Renamed copies of trajectories: the same run about names it never had.

A policy trained on a few hundred runs can get a name right by recalling it from training rather than by
copying it from what the run has read. A renamed copy replaces a run's names (a task family says which:
:func:`orchard.tasks.swe.skills.renamed_runs`, :func:`orchard.tasks.claw.renaming.renamed_episodes`)
throughout, task, actions and observations alike, so that in it only copying predicts them.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from orchard.data.trajectory import Message, Trajectory


def rename(text: str, mapping: Mapping[str, str]) -> str:
    """``text`` with every whole-word occurrence of a key of ``mapping`` (alone, in a snake_case identifier,
    or plural; after an escaped newline or tab too, as in a JSON string) replaced by its value, in one pass (a
    new name is never renamed again)."""
    if not mapping:
        return text
    words = "|".join(re.escape(word) for word in sorted(mapping, key=len, reverse=True))
    return re.sub(rf"(?:(?<![A-Za-z])|(?<=\\[nt]))({words})(?=s?(?![A-Za-z]))",
                  lambda match: mapping[match.group(1)], text)


def renamed_copy(run: Trajectory, mapping: Mapping[str, str], copy: int) -> Trajectory:
    """``run`` with ``mapping`` applied to every message (content, reasoning and tool calls' arguments, nested
    ones included), as ``<id>-renamed<copy>``. It keeps its task id (its side of any split by task), and its
    messages lose the token ids and logprobs of a sampling: no policy sampled the renamed text."""
    return run.model_copy(update={"id": f"{run.id}-renamed{copy}",
                                  "messages": [_renamed(message, mapping) for message in run.messages]})


def _renamed(message: Message, mapping: Mapping[str, str]) -> Message:
    calls = [call.model_copy(update={"arguments": _renamed_value(call.arguments, mapping)})
             for call in message.tool_calls]
    return message.model_copy(update={
        "content": rename(message.content, mapping), "tool_calls": calls,
        "reasoning": message.reasoning and rename(message.reasoning, mapping),
        "token_ids": None, "logprobs": None, "prompt_tokens": None, "prompt_digest": None, "weight_version": None})


def _renamed_value(value: Any, mapping: Mapping[str, str]) -> Any:
    if isinstance(value, str):
        return rename(value, mapping)
    if isinstance(value, dict):
        return {key: _renamed_value(item, mapping) for key, item in value.items()}
    if isinstance(value, list):
        return [_renamed_value(item, mapping) for item in value]
    return value
