"""The ReAct core: one agent loop that every harness runs on.

A run alternates two parties until the task is submitted or a limit is reached:

- the **policy** (:class:`Policy`) reads the conversation and writes the next assistant turn;
- the **harness** (:class:`Harness`) turns that turn into actions, runs them in the sandbox and
  answers with observations. It owns the prompts, the tool schemas, the action syntax and what
  counts as a submission; the loop owns only the order of things, the limits and the bookkeeping.

Every run returns a :class:`~orchard.data.trajectory.Trajectory` whose outcome status says how it
ended (``reward``/``resolved`` are left for a grader):

============  =====================================================================================
completed     the harness saw a submission (``metadata["submission"]`` holds it)
truncated     the policy ran into a limit: ``max_turns`` turns without a submission, the conversation
              reached ``max_tokens``, or ``max_format_errors`` consecutive format errors
aborted       the policy (engine, server) or the sandbox raised (``metadata["error"]`` says what)
timed_out     the wall clock (``time_limit``) ran out; a command still running is cancelled, which
              makes the sandbox kill its process group
============  =====================================================================================

``metadata["end_reason"]`` is the finer cause, an :class:`~orchard.data.trajectory.EndReason`:
``submitted``, ``step_limit``, ``token_limit``, ``format_errors``, ``policy_error``,
``sandbox_error`` or ``time_limit``.

Design choices:

- **Format errors are observations.** A turn the harness cannot parse (no action, several, an
  unknown tool, bad arguments) is answered with a message saying what was wrong, and counted. The
  count of *consecutive* errors ends a run (a model that recovers is not punished for a slip); the
  total is kept in the metadata. That end is ``truncated``, like the step limit it stands in for
  (mini-swe-agent answers format errors until its step limit): the run is the policy's failure and
  a usable negative for RL (:mod:`orchard.train.bar` takes completed and truncated runs), where
  ``aborted`` means a failure outside the policy.
- **Actions are tool calls** (:class:`~orchard.data.trajectory.ToolCall`): a harness parses a turn
  into the calls it will run, whether the model wrote them as tool calls or in a text syntax.
- **The token limit is a context budget**: the length of the latest prompt plus its completion, as
  the policy reports it. A turn that reaches it ends the run unexecuted (it was most likely cut
  off); a policy that knows the prompt length in advance (:class:`~orchard.harness.policies.EnginePolicy`)
  caps generation at the room left and raises :class:`ContextLimitExceeded` when there is none.
- **Errors of the policy and of the sandbox abort the run instead of raising**, so one bad
  episode among thousands of RL rollouts becomes an ``aborted`` trajectory, not a crashed job.
  Bugs in a harness (any other exception) and cancellation still propagate.
- **The wall clock covers the loop only** (not sandbox creation, setup or grading, which
  :func:`~orchard.harness.episode.run_episode` runs around it). It is enforced by cancelling
  whatever is in flight; a synchronous engine call already running in a worker thread finishes in
  the background, and its result is dropped.
- The sandbox belongs to the caller here; :func:`~orchard.harness.episode.run_episode` owns one.
"""

from __future__ import annotations

import asyncio
import dataclasses
import random
import time
from dataclasses import dataclass, field
from typing import Any, Protocol

from orchard.data.trajectory import EndReason, Message, Outcome, ToolCall, Trajectory
from orchard.env.client import AsyncSandbox, OrchardError

DEFAULT_MAX_TURNS = 30  # the turn cap wherever a config leaves it open: the one default of `max_turns`

@dataclass(frozen=True)
class Limits:
    """When a run stops if the task is not submitted first.

    ``max_turns`` counts policy turns (format errors included); ``max_tokens`` is the context
    budget (prompt plus completion of a turn; ``None``: unlimited); ``time_limit`` is wall-clock
    seconds for the loop (``None``: unlimited); ``max_format_errors`` consecutive format errors
    abort the run.
    """

    max_turns: int = DEFAULT_MAX_TURNS
    max_tokens: int | None = None
    time_limit: float | None = None
    max_format_errors: int = 3

    def __post_init__(self) -> None:
        if self.max_turns < 1:
            raise ValueError(f"max_turns must be at least 1, got {self.max_turns}")
        if self.max_tokens is not None and self.max_tokens < 1:
            raise ValueError(f"max_tokens must be positive or None, got {self.max_tokens}")
        if self.time_limit is not None and not self.time_limit > 0:
            raise ValueError(f"time_limit must be positive seconds or None, got {self.time_limit}")
        if self.max_format_errors < 1:
            raise ValueError(f"max_format_errors must be at least 1, got {self.max_format_errors}")


class FormatError(Exception):
    """A turn the harness cannot turn into actions. Its text is what the model is told."""


class ContextLimitExceeded(Exception):
    """Raised by a policy when the next prompt alone leaves no room under the token budget."""


@dataclass
class Observation:
    """What running an action produced.

    ``message`` is shown to the model (``None``: nothing, as after a submission), then ``then``
    (a screenshot after a tool's answer). A non-``None`` ``submission`` ends the run as completed.
    ``metadata`` is merged into the trajectory's.
    """

    message: Message | None
    submission: str | None = None
    metadata: dict[str, Any] = field(default_factory=dict)
    then: list[Message] = field(default_factory=list)


@dataclass
class Turn:
    """An assistant turn as a policy produced it.

    ``errors`` are problems the policy met while parsing its own output (a ``<tool_call>`` that is
    not JSON, say); harnesses treat them as format errors. Token counts are ``None`` when unknown.
    """

    message: Message
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    finish_reason: str | None = None
    errors: list[str] = field(default_factory=list)

    @property
    def context_tokens(self) -> int | None:
        if self.prompt_tokens is None or self.completion_tokens is None:
            return None
        return self.prompt_tokens + self.completion_tokens


@dataclass
class Conversation:
    """One episode's conversation as the policy sees it.

    The loop only ever appends to ``messages``, which lets a policy render incrementally; ``state``
    is where a policy keeps such per-episode caches (policies themselves are shared by many
    concurrent episodes, so they hold none). ``seed`` varies sampling between episodes.

    ``sandbox`` is the episode's sandbox, for privileged teachers only (an oracle that reads the
    page it is acting on, as the SWE oracle reads the gold patch); model policies never look at it.
    """

    messages: list[Message]
    tools: list[dict[str, Any]] | None = None
    seed: int = 0
    state: dict[Any, Any] = field(default_factory=dict)
    sandbox: AsyncSandbox | None = None


class Policy(Protocol):
    name: str

    async def act(self, conversation: Conversation, *, max_context: int | None = None) -> Turn:
        """The next assistant turn. ``max_context`` is the token budget of prompt plus completion;
        raise :class:`ContextLimitExceeded` when the prompt alone reaches it."""
        ...


class Harness(Protocol):
    """A harness. It may also define ``async opening(sandbox) -> list[Message]``: observations shown
    before the first turn (the browser harness's first screenshot), and ``async tools_for(sandbox)
    -> list[dict]``: the episode's tool schemas when the task's environment defines them (a Claw
    task's services), in place of :attr:`tools`. A sandbox error in either aborts the run like one
    in :meth:`execute`."""

    name: str
    system_prompt: str
    tools: list[dict[str, Any]] | None  # OpenAI tool schemas, or None for a text-only action syntax

    def task_prompt(self, task: str) -> str:
        """The first user message."""
        ...

    def parse(self, turn: Turn) -> list[ToolCall]:
        """The turn's actions, in order; raise :class:`FormatError` if there are none to run."""
        ...

    async def execute(self, call: ToolCall, sandbox: AsyncSandbox) -> Observation:
        """Run one action. Sandbox failures raise :class:`~orchard.env.client.OrchardError`."""
        ...

    def reject(self, turn: Turn, error: FormatError) -> list[Message]:
        """The messages that tell the model why its turn was not run."""
        ...


@dataclass
class _Run:
    """The counters of one run."""

    steps: int = 0
    format_errors: int = 0
    consecutive_errors: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    context_tokens: int | None = None
    policy_s: float = 0.0
    env_s: float = 0.0
    end_reason: EndReason | None = None
    error: str | None = None
    submission: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def end(self, reason: EndReason, error: str | None = None) -> None:
        self.end_reason, self.error = reason, error


async def run_agent(harness: Harness, policy: Policy, sandbox: AsyncSandbox, task: str, *,
                    limits: Limits = Limits(), task_id: str = "task", seed: int | None = None,
                    metadata: dict[str, Any] | None = None) -> Trajectory:
    """Run ``harness`` with ``policy`` on ``task`` in ``sandbox`` until submission or a limit.

    The sandbox is used, never created or deleted. ``seed`` (default: random) is handed to the
    policy through the conversation; ``metadata`` is merged into the trajectory's.
    """
    if not isinstance(task, str) or not task.strip():
        raise ValueError("task must be a non-empty string (the task's description)")
    conversation = Conversation(
        messages=[Message(role="system", content=harness.system_prompt),
                  Message(role="user", content=harness.task_prompt(task))],
        tools=harness.tools, seed=random.getrandbits(31) if seed is None else seed, sandbox=sandbox)
    run = _Run()
    started_at, started = time.time(), time.monotonic()
    deadline = asyncio.timeout(limits.time_limit)
    try:
        async with deadline:
            await _loop(harness, policy, sandbox, conversation, limits, run)
    except TimeoutError:
        if not deadline.expired():
            raise
        run.end(EndReason.TIME_LIMIT, f"the run took longer than {limits.time_limit} s")
    info = {
        "steps": run.steps, "format_errors": run.format_errors, "end_reason": run.end_reason,
        "submission": run.submission, "prompt_tokens": run.prompt_tokens,
        "completion_tokens": run.completion_tokens, "context_tokens": run.context_tokens,
        "started_at": started_at, "elapsed_s": time.monotonic() - started, "policy_s": run.policy_s,
        "env_s": run.env_s, "limits": dataclasses.asdict(limits), "sandbox_id": sandbox.id,
        "seed": conversation.seed, **run.extra, **(metadata or {}),
    }
    if run.error is not None:
        info["error"] = run.error
    return Trajectory(task_id=task_id, harness=harness.name, policy=policy.name, messages=conversation.messages,
                      tools=conversation.tools, outcome=Outcome(status=run.end_reason.status), metadata=info)


async def _loop(harness: Harness, policy: Policy, sandbox: AsyncSandbox, conversation: Conversation,
                limits: Limits, run: _Run) -> None:
    messages = conversation.messages
    tools_for, opening = getattr(harness, "tools_for", None), getattr(harness, "opening", None)
    if tools_for is not None or opening is not None:
        clock = time.monotonic()
        try:
            if tools_for is not None:
                conversation.tools = await tools_for(sandbox)
            if opening is not None:
                messages.extend(await opening(sandbox))
        except OrchardError as exc:
            return run.end(EndReason.SANDBOX_ERROR, f"{type(exc).__name__}: {exc}")
        finally:
            run.env_s += time.monotonic() - clock
    while True:
        if run.steps >= limits.max_turns:
            return run.end(EndReason.STEP_LIMIT)
        clock = time.monotonic()
        try:
            turn = await policy.act(conversation, max_context=limits.max_tokens)
        except ContextLimitExceeded as exc:
            return run.end(EndReason.TOKEN_LIMIT, str(exc))
        except Exception as exc:  # the engine or server failed: this episode is lost, the job is not
            return run.end(EndReason.POLICY_ERROR, f"{type(exc).__name__}: {exc}")
        finally:
            run.policy_s += time.monotonic() - clock
        run.steps += 1
        messages.append(turn.message)
        run.prompt_tokens += turn.prompt_tokens or 0
        run.completion_tokens += turn.completion_tokens or 0
        run.context_tokens = turn.context_tokens
        if limits.max_tokens is not None and (turn.context_tokens or 0) >= limits.max_tokens:
            return run.end(EndReason.TOKEN_LIMIT)

        try:
            calls = harness.parse(turn)
        except FormatError as error:
            run.format_errors += 1
            run.consecutive_errors += 1
            messages.extend(harness.reject(turn, error))
            if run.consecutive_errors >= limits.max_format_errors:
                return run.end(EndReason.FORMAT_ERRORS, str(error))
            continue
        run.consecutive_errors = 0

        for call in calls:
            clock = time.monotonic()
            try:
                observation = await harness.execute(call, sandbox)
            except OrchardError as exc:
                return run.end(EndReason.SANDBOX_ERROR, f"{type(exc).__name__}: {exc}")
            finally:
                run.env_s += time.monotonic() - clock
            run.extra.update(observation.metadata)
            if observation.message is not None:
                messages.append(observation.message)
            messages.extend(observation.then)
            if observation.submission is not None:
                run.submission = observation.submission
                return run.end(EndReason.SUBMITTED)
