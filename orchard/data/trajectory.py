"""Trajectories: what an agent did in an environment, kept as trainable data.

A :class:`Trajectory` holds the conversation (roles, tool calls, observations), the token ids and
logprobs the policy sampled where they are known, the outcome, and optionally the teacher's
per-step values and the rise segments computed from them (:mod:`orchard.data.rise`).

An assistant message the policy sampled carries its ``token_ids`` and ``logprobs``, the version of
the weights that sampled it, and the length and digest (:func:`token_digest`) of the prompt it was
sampled under: training rows are checked against them token for token, so a row never trains on
a context the policy did not see.

:class:`EndReason` says how a run ended (``metadata["end_reason"]``); the harness core, the RL loop
and the reports share it. Its :attr:`~EndReason.graded` tells whether the policy ended the run
itself (submitted, or ran into a step, token or format limit), so that it is graded and trained
on; a run cut by the wall clock or broken by the engine or sandbox is not (reward ``None``).

Steps: step ``t`` is the ``t``-th assistant message (the action ``a_t``). ``values`` holds
``V(s_0) .. V(s_T)``, one more than there are actions: ``V(s_t)`` is the estimate before action
``t`` and ``V(s_{t+1})`` the one after it.

Storage is append-only JSONL (:class:`TrajectoryWriter`, over :mod:`orchard.data.jsonl`): each
record is written with one ``write`` of a whole line. A writer killed mid-record leaves at most a
torn last line, which :func:`read_trajectories` reports and skips; a writer opening such a file
first moves the torn fragment to ``<file>.torn`` so later records never follow a broken line. A
malformed line that is not the last is an error naming the file and line.

Readers: Orchard's own records, mini-swe-agent trajectories (``trajectory_format:
mini-swe-agent-1.1``) and plain OpenAI chat-completions message lists (:func:`load_trajectory`).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import uuid
from collections.abc import Iterable, Iterator, Sequence
from enum import StrEnum
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from orchard.data.images import ImageRef
from orchard.data.jsonl import JsonlFormatError, JsonlWriter, ReadReport, read_jsonl

log = logging.getLogger(__name__)
FORMAT = "orchard-trajectory-1"
Status = Literal["completed", "truncated", "aborted", "timed_out"]


class EndReason(StrEnum):
    """Why a run ended; each reason implies the run's :data:`Status`."""

    SUBMITTED = "submitted"  # the harness saw a submission
    STEP_LIMIT = "step_limit"  # max_turns turns without a submission
    TOKEN_LIMIT = "token_limit"  # the conversation reached the context budget
    FORMAT_ERRORS = "format_errors"  # max_format_errors consecutive turns the harness could not parse
    TIME_LIMIT = "time_limit"  # the wall clock ran out
    POLICY_ERROR = "policy_error"  # the engine or model server failed
    SANDBOX_ERROR = "sandbox_error"  # the sandbox, its set-up or the grader failed

    @property
    def status(self) -> Status:
        return _STATUS[self]

    @property
    def graded(self) -> bool:
        """The policy ended the run itself: grade it, and train on it."""
        return _STATUS[self] in ("completed", "truncated")


_STATUS: dict[EndReason, Status] = {
    EndReason.SUBMITTED: "completed", EndReason.STEP_LIMIT: "truncated", EndReason.TOKEN_LIMIT: "truncated",
    EndReason.FORMAT_ERRORS: "truncated", EndReason.TIME_LIMIT: "timed_out", EndReason.POLICY_ERROR: "aborted",
    EndReason.SANDBOX_ERROR: "aborted"}


def token_digest(token_ids: Sequence[int]) -> str:
    """A digest of a token-id sequence: two sequences share it only if they are equal, id for id."""
    return hashlib.blake2b(json.dumps(list(token_ids), separators=(",", ":")).encode(), digest_size=16).hexdigest()


class ToolCall(BaseModel):
    """One call of a tool: what a model asked for, and what a harness runs. The project's one type of it."""

    model_config = ConfigDict(extra="forbid")

    id: str | None = None
    name: str
    arguments: dict[str, Any] | str  # a JSON string when the model wrote one that does not parse


class Message(BaseModel):
    model_config = ConfigDict(extra="forbid")

    role: Literal["system", "user", "assistant", "tool"]
    content: str = ""
    reasoning: str | None = None
    tool_calls: list[ToolCall] = Field(default_factory=list)
    tool_call_id: str | None = None  # on tool messages: the call this observation answers
    images: list[ImageRef] = Field(default_factory=list)  # by content hash (orchard.data.images), after the text
    token_ids: list[int] | None = None  # assistant: the ids the policy sampled after the generation prompt
    logprobs: list[float] | None = None
    prompt_tokens: int | None = None  # assistant: the length of the prompt it was sampled under
    prompt_digest: str | None = None  # assistant: token_digest() of that prompt
    weight_version: int | None = None  # assistant: the version of the weights that sampled it

    @model_validator(mode="after")
    def _aligned(self) -> Message:
        if self.logprobs is not None and (self.token_ids is None or len(self.logprobs) != len(self.token_ids)):
            raise ValueError("logprobs need token_ids of the same length")
        sampled = (self.token_ids, self.prompt_tokens, self.prompt_digest, self.weight_version)
        if self.role != "assistant" and any(field is not None for field in sampled):
            raise ValueError("only assistant messages carry what the policy sampled")
        if (self.prompt_tokens is None) != (self.prompt_digest is None):
            raise ValueError("prompt_tokens and prompt_digest go together")
        return self

    def to_chat(self) -> dict[str, Any]:
        """The OpenAI-shaped message the chat formats render."""
        chat: dict[str, Any] = {"role": self.role, "content": self.content}
        if self.reasoning is not None:
            chat["reasoning_content"] = self.reasoning
        if self.tool_calls:
            chat["tool_calls"] = [{"id": c.id, "type": "function",
                                   "function": {"name": c.name, "arguments": c.arguments}} for c in self.tool_calls]
        if self.token_ids is not None:
            chat["token_ids"] = self.token_ids
        if self.images:
            chat["images"] = list(self.images)
        return chat


class Outcome(BaseModel):
    """How an episode went: ``reward`` for training (``None``: the episode says nothing of the policy,
    and the sample is dropped), ``resolved`` for evaluation, and the run's status."""

    model_config = ConfigDict(extra="forbid")

    reward: float | None = None
    resolved: bool = False
    status: Status = "completed"


class Trajectory(BaseModel):
    model_config = ConfigDict(extra="forbid")

    format: Literal["orchard-trajectory-1"] = FORMAT
    id: str = Field(default_factory=lambda: uuid.uuid4().hex)
    task_id: str
    harness: str = "unknown"
    policy: str = "unknown"
    messages: list[Message]
    tools: list[dict[str, Any]] | None = None  # OpenAI tool schemas offered to the policy
    outcome: Outcome = Field(default_factory=Outcome)
    values: list[float] | None = None  # V(s_0) .. V(s_T)
    rise_segments: list[tuple[int, int]] | None = None  # inclusive action-index ranges
    metadata: dict[str, Any] = Field(default_factory=dict)

    @property
    def num_actions(self) -> int:
        return sum(message.role == "assistant" for message in self.messages)

    @property
    def end_reason(self) -> EndReason | None:
        """Why the run ended, when the harness that ran it recorded it (foreign formats do not)."""
        reason = self.metadata.get("end_reason")
        return EndReason(reason) if reason is not None else None

    @property
    def tampered(self) -> bool:
        """The grader found the policy manipulating what grades it (``metadata["tampering"]`` says what)."""
        return bool(self.metadata.get("tampering"))

    @model_validator(mode="after")
    def _steps(self) -> Trajectory:
        if self.values is not None and len(self.values) != self.num_actions + 1:
            raise ValueError(f"values need one entry per state: {self.num_actions + 1} for "
                             f"{self.num_actions} actions, got {len(self.values)}")
        for start, end in self.rise_segments or ():
            if not 0 <= start <= end < self.num_actions:
                raise ValueError(f"rise segment ({start}, {end}) is outside actions 0..{self.num_actions - 1}")
        return self


class TrajectoryFormatError(ValueError):
    """A record that cannot be read, with the file and line it came from."""


class TrajectoryWriter(JsonlWriter):
    """Append trajectories to a JSONL file, one whole line per ``write``; safe to kill at any time."""

    def write(self, trajectory: Trajectory) -> None:
        self.write_line(trajectory.model_dump_json(exclude_none=True).encode())


def save_trajectories(path: str, trajectories: Iterable[Trajectory]) -> None:
    """Write ``trajectories`` to ``path`` whole or not at all: through ``path.partial``, renamed when
    complete, so a killed run leaves no file that looks finished."""
    partial = path + ".partial"
    with contextlib.suppress(FileNotFoundError):
        os.remove(partial)  # left by a killed run: the writer appends
    with TrajectoryWriter(partial) as writer:
        for trajectory in trajectories:
            writer.write(trajectory)
    os.replace(partial, path)


def read_trajectories(path: str, report: ReadReport | None = None) -> Iterator[Trajectory]:
    """Trajectories from a JSONL file of Orchard, mini-swe-agent or OpenAI-message records.

    A torn last line (a writer killed mid-record) is logged, noted in ``report`` and skipped; any
    other unreadable line raises :class:`TrajectoryFormatError` naming it.
    """
    try:
        for number, record in read_jsonl(path, report):
            try:
                yield load_trajectory(record, default_id=f"{os.path.basename(path)}:{number}")
            except (ValidationError, ValueError, TypeError, KeyError) as exc:
                raise TrajectoryFormatError(f"{path}:{number}: {_first_error(exc)}") from exc
    except JsonlFormatError as exc:
        raise TrajectoryFormatError(str(exc)) from exc


def _first_error(exc: Exception) -> str:
    if isinstance(exc, ValidationError):
        error = exc.errors()[0]
        return f"{'.'.join(str(p) for p in error['loc']) or 'record'}: {error['msg']}"
    return str(exc)


def load_trajectory(record: Any, default_id: str | None = None, **fields: Any) -> Trajectory:
    """One trajectory from any supported record; ``fields`` (task_id, outcome, ...) fill in what a
    foreign format does not carry."""
    if isinstance(record, list):
        return from_openai_messages(record, task_id=default_id or "unknown", **fields)
    if not isinstance(record, dict):
        raise TypeError(f"a trajectory record is an object or a message list, not {type(record).__name__}")
    if record.get("format") == FORMAT:
        return Trajectory.model_validate({**record, **fields})
    if record.get("trajectory_format", "").startswith("mini-swe-agent"):
        return from_mini_swe_agent(record, **{"task_id": default_id or "unknown", **fields})
    if "messages" in record:
        rest = {k: v for k, v in record.items() if k in ("task_id", "harness", "policy", "tools", "metadata")}
        return from_openai_messages(record["messages"], **{"task_id": default_id or "unknown", **rest, **fields})
    raise ValueError("unknown record: expected format 'orchard-trajectory-1', a mini-swe-agent trajectory, "
                     "or OpenAI chat messages")


def _openai_message(message: dict[str, Any]) -> Message:
    content = message.get("content") or ""
    if isinstance(content, list):  # content parts
        content = "".join(part.get("text", "") for part in content if isinstance(part, dict))
    calls = []
    for call in message.get("tool_calls") or []:
        function = call.get("function", call)
        arguments = function.get("arguments", {})
        if isinstance(arguments, str):
            arguments = _json_object(arguments)
        calls.append(ToolCall(id=call.get("id"), name=function["name"], arguments=arguments))
    return Message(role=message["role"], content=content, tool_calls=calls, tool_call_id=message.get("tool_call_id"),
                   reasoning=message.get("reasoning_content") or message.get("reasoning"))


def _json_object(text: str) -> dict[str, Any] | str:
    """The object a JSON string holds, or the string itself when it holds none (as the model wrote it)."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError:
        return text
    return value if isinstance(value, dict) else text


def from_openai_messages(messages: list[dict[str, Any]], **fields: Any) -> Trajectory:
    """A trajectory from an OpenAI chat-completions message list (a recording proxy's, a harness's)."""
    return Trajectory(messages=[_openai_message(m) for m in messages], **{"harness": "openai-messages", **fields})


_MINI_STATUS: dict[str, Status] = {"Submitted": "completed", "LimitsExceeded": "truncated", "TimeExceeded": "timed_out"}


def from_mini_swe_agent(record: dict[str, Any], **fields: Any) -> Trajectory:
    """A mini-swe-agent trajectory (``trajectory_format: mini-swe-agent-1.1``).

    Its final ``exit`` message becomes the status (``Submitted`` -> completed, ``LimitsExceeded`` ->
    truncated, ``TimeExceeded`` or a timeout -> timed_out, anything else -> aborted). mini-swe-agent does not know
    whether the submission resolved the task: pass ``outcome=`` from the evaluation.
    """
    info = record.get("info", {})
    messages = [m for m in record["messages"] if m.get("role") in ("system", "user", "assistant", "tool")]
    exits = [m for m in record["messages"] if m.get("role") == "exit"]
    exit_status = info.get("exit_status") or (exits[-1].get("extra", {}).get("exit_status") if exits else "") or ""
    status = _MINI_STATUS.get(exit_status) or ("timed_out" if "timeout" in exit_status.lower() else "aborted")
    model = info.get("config", {}).get("model", {}).get("model_name", "unknown")
    metadata = {"exit_status": exit_status, "submission": info.get("submission", ""),
                "mini_version": info.get("mini_version"), "model_stats": info.get("model_stats")}
    defaults = {"harness": "mini-swe-agent", "policy": model, "outcome": Outcome(status=status), "metadata": metadata}
    return Trajectory(messages=[_openai_message(m) for m in messages], **{**defaults, **fields})
