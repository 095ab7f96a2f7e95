"""The Task contract: what the RL loop, collection and evaluation know of a task, and nothing more.

A task instance has an ``id``, the ``prompt`` a harness shows the policy, and two coroutines over
the sandbox it runs in:

* ``setup(sandbox)`` puts the task's environment into a fresh sandbox (a repository, a browser, a
  set of tool services);
* ``settled(trajectory) -> Outcome | None`` decides the episodes that need no grader (an empty
  submission), and ``grade(sandbox, trajectory) -> Outcome`` the others: how the episode went. The outcome's ``reward`` is
  what RL optimises; ``None`` means the episode says nothing about the policy (a judge that
  failed, a site behind a captcha): the sample is dropped and masked, the paper's
  ``remove_sample``. ``resolved`` is what evaluation counts.

A task family says what its tasks ask of the layers below, once, in a :class:`TaskFamily`: the
sandbox spec (image, cpu, memory, network, ttl: :class:`~orchard.env.api.SandboxSpec` fields) and
the harness limits it expects. Callers may tighten the limits (an RL config caps the turns).

:func:`~orchard.harness.episode.run_episode` runs one: sandbox, ``setup``, the harness, ``grade``
(only when the policy ended the episode itself: a run cut by the wall clock or broken by the
sandbox has reward ``None`` and is not graded; in a pristine sandbox of its own where the family
asks for it), and the sandboxes deleted.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from orchard.data.trajectory import Outcome, Trajectory
from orchard.env.client import AsyncSandbox
from orchard.harness.core import Limits


@dataclass(frozen=True)
class TaskFamily:
    """What every task of a family asks for.

    ``setup_in_files``: a task's set-up leaves only files behind (no running process), so it can be
    done once, kept as a snapshot, and forked for every episode
    (:class:`~orchard.harness.episode.SetupCache`).

    ``pristine_grading``: ``grade`` runs in a pristine copy of the task's set-up, not in the
    sandbox the policy used. The episode's sandbox is deleted first, with every process the
    policy left running in it; the grader gets a fresh sandbox (forked from the set-up snapshot,
    or set up anew) and reads what it needs of the episode from the trajectory (a submitted
    patch). Use it wherever the answer can be carried out of the sandbox as data: nothing the
    policy did to its sandbox can then reach the grader. Families whose state only exists in the
    episode's sandbox (tool services' logs, a browser's page) grade in place.

    ``reusable``: a task's set-up resets a sandbox an earlier episode used (a browser gets a fresh
    context), so a :class:`~orchard.harness.episode.SandboxPool` may keep its sandboxes between
    episodes instead of making one per episode.
    """

    name: str
    sandbox: Mapping[str, Any] = field(default_factory=lambda: {"cpu": 1.0, "memory": "2Gi", "ttl": 300.0})
    limits: Limits = field(default_factory=Limits)
    setup_in_files: bool = False
    pristine_grading: bool = False
    reusable: bool = False


@runtime_checkable
class Task(Protocol):
    """One task instance (see the module docstring)."""

    @property
    def id(self) -> str: ...

    @property
    def prompt(self) -> str:
        """What the harness puts in the first user turn."""
        ...

    @property
    def family(self) -> TaskFamily: ...

    async def setup(self, sandbox: AsyncSandbox) -> None:
        """Prepare a fresh sandbox for an episode of this task."""
        ...

    def settled(self, trajectory: Trajectory) -> Outcome | None:
        """The outcome when the trajectory alone decides it (an SWE episode that submitted nothing),
        so that no grader runs and no pristine sandbox is made; ``None`` otherwise."""
        ...

    async def grade(self, sandbox: AsyncSandbox, trajectory: Trajectory) -> Outcome:
        """Grade an episode the policy finished (submitted, or ran into a limit) and :meth:`settled`
        left open: in its sandbox, or in a pristine copy of the set-up when the family says
        ``pristine_grading``."""
        ...


Setup = Callable[[AsyncSandbox], Awaitable[None]]
Grade = Callable[[AsyncSandbox, Trajectory], Awaitable[Outcome]]


@dataclass(frozen=True)
class FunctionTask:
    """A task made of two coroutines, for scripts, notebooks and tests. Without ``grade_fn`` an
    episode is not graded: its reward is ``None``."""

    id: str
    prompt: str
    setup_fn: Setup | None = None
    grade_fn: Grade | None = None
    family: TaskFamily = TaskFamily("function")

    async def setup(self, sandbox: AsyncSandbox) -> None:
        if self.setup_fn is not None:
            await self.setup_fn(sandbox)

    def settled(self, trajectory: Trajectory) -> Outcome | None:
        return None

    async def grade(self, sandbox: AsyncSandbox, trajectory: Trajectory) -> Outcome:
        if self.grade_fn is None:
            return Outcome(reward=None)
        return await self.grade_fn(sandbox, trajectory)
