"""Episodes of any :class:`~orchard.harness.task.Task`: one sandbox each, always deleted.

:func:`run_episode` is one: create a sandbox of the task family's spec, ``task.setup``, the agent
loop (:func:`~orchard.harness.core.run_agent`), ``task.grade``, delete. A family with
``pristine_grading`` is graded in a second sandbox, a fresh copy of the set-up, after the
episode's own is deleted (the grader never sees what the policy did to its sandbox, and nothing
the policy started outlives its episode). The task is graded only
when the policy ended the episode itself (it submitted, or ran into a step, token or format
limit); an episode cut by the wall clock, or broken by the engine or the sandbox, says nothing of
the policy and gets reward ``None`` without a grader run (the paper excludes time-outs from
training). The delete is in a ``finally``: it happens after a success, after any exception (from
setup, the agent, the grader) and after cancellation, which then propagate unchanged. The delete
itself runs as a shielded task, so cancelling the caller again while it is in flight cannot stop
it.

:class:`EpisodeRunner` runs many, at most ``concurrency`` sandboxes at a time, and never raises:
an episode whose sandbox, set-up or grader failed, or that outran ``episode_seconds`` (the whole
episode's budget: set-up, agent and grading), comes back as an ``aborted`` trajectory with reward
``None`` and the error in its metadata. RL, collection and evaluation all run their episodes here.

With a :class:`SetupCache`, a task whose family says its set-up is only files
(``TaskFamily.setup_in_files``) is set up once, in a sandbox that is snapshotted and deleted, and
every episode of it starts from a copy of that snapshot: on the local backend that is 0.07 s where
a fresh sandbox and the SWE set-up take 0.23 s. Where the backend has no snapshots (Kubernetes),
every episode sets up its own sandbox.

The one gap no client can close is a creation interrupted in flight (the server may finish
creating a sandbox whose id never reached us). Such a sandbox receives no heartbeats, so the
orchestrator reaps it when its ``ttl`` runs out; keep the spec's ``ttl`` modest for that reason
(heartbeats keep a live episode's sandbox alive however long it runs). If the delete call itself
fails (the orchestrator unreachable after the SDK's retries), the failure is logged and the TTL
reclaims the sandbox likewise.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from orchard.data.trajectory import EndReason, Outcome, Trajectory
from orchard.env.client import AsyncSandbox, AsyncSandboxClient, OrchardError, SandboxNotFound, Unsupported
from orchard.harness.core import Harness, Limits, Policy, run_agent
from orchard.harness.task import Task

log = logging.getLogger(__name__)

_deleting: set[asyncio.Task] = set()  # strong references, so a pending delete is never garbage-collected


async def run_episode(client: AsyncSandboxClient, harness: Harness, policy: Policy, task: Task, *,
                      limits: Limits | None = None, seed: int | None = None, metadata: dict[str, Any] | None = None,
                      setups: SetupCache | None = None, pool: SandboxPool | None = None) -> Trajectory:
    """Run ``task`` once with ``harness`` and ``policy`` in a fresh sandbox (see the module docstring).

    ``limits`` replace the family's; ``seed`` (default: random) is the episode's; ``setups`` forks
    the sandbox from the task's set-up snapshot; ``pool`` lends a sandbox an earlier episode of a
    ``reusable`` family used, and takes it back after a clean end. The grader's outcome replaces
    the trajectory's, except its status, which stays the run's. ``metadata["episode_timing"]`` has
    the seconds spent creating the sandbox, setting it up and grading.
    """
    pooled = pool is not None and task.family.reusable
    clock = time.monotonic()
    box, ready = await (pool.borrow(client, task) if pooled else episode_sandbox(client, task, setups))
    timing, clean_end = {"create_s": time.monotonic() - clock}, False
    try:
        clock = time.monotonic()
        if not ready:
            await task.setup(box)
        timing["setup_s"] = time.monotonic() - clock
        trajectory = await run_agent(harness, policy, box, task.prompt, limits=limits or task.family.limits,
                                     task_id=task.id, seed=seed, metadata=metadata)
        clock = time.monotonic()
        outcome, box = await grade_episode(client, task, trajectory, box, setups)
        timing["grade_s"] = time.monotonic() - clock
        trajectory.outcome = outcome.model_copy(update={"status": trajectory.outcome.status})
        trajectory.metadata["episode_timing"] = timing
        clean_end = trajectory.end_reason is not None and trajectory.end_reason.graded
        return trajectory
    finally:
        if box is not None and pooled:
            await pool.give_back(box, task, clean_end)
        elif box is not None:
            await delete_sandbox(box)


async def grade_episode(client: AsyncSandboxClient, task: Task, trajectory: Trajectory, box: AsyncSandbox,
                        setups: SetupCache | None) -> tuple[Outcome, AsyncSandbox | None]:
    """The outcome of a finished run, and the episode's sandbox if it still exists (a family with
    ``pristine_grading`` has it deleted first, with every process the policy left running in it)."""
    if trajectory.end_reason is None or not trajectory.end_reason.graded:
        return Outcome(reward=None, resolved=False), box
    if (settled := task.settled(trajectory)) is not None:
        return settled, box
    if task.family.pristine_grading:
        await delete_sandbox(box)
        return await grade_pristine(client, task, trajectory, setups), None
    return await task.grade(box, trajectory), box


async def episode_sandbox(client: AsyncSandboxClient, task: Task, setups: SetupCache | None) -> tuple[AsyncSandbox, bool]:
    """A sandbox for ``task`` and whether it is already set up (forked from its set-up snapshot)."""
    if setups is not None:
        return await setups.sandbox(task)
    return await client.create(**task.family.sandbox), False


async def grade_pristine(client: AsyncSandboxClient, task: Task, trajectory: Trajectory,
                          setups: SetupCache | None) -> Outcome:
    """``task.grade`` in a sandbox the policy never touched: a copy of the set-up, deleted afterwards."""
    clean, ready = await episode_sandbox(client, task, setups)
    try:
        if not ready:
            await task.setup(clean)
        return await task.grade(clean, trajectory)
    finally:
        await delete_sandbox(clean)


async def delete_sandbox(box: AsyncSandbox) -> None:
    task = asyncio.ensure_future(box.delete())
    _deleting.add(task)
    task.add_done_callback(_deleting.discard)
    try:
        await asyncio.shield(task)
    except asyncio.CancelledError:
        raise  # cancelled again: the delete goes on in its task
    except Exception as exc:
        log.warning("could not delete sandbox %s (%s); its ttl of %.0f s will reclaim it",
                    box.id, exc, box.info.spec.ttl)


class SetupCache:
    """Each task's set-up done once and kept as a snapshot, forked for every episode of it.

    Only tasks whose family has ``setup_in_files`` are cached; the others, and every task on a
    backend without snapshots, are set up in each episode's own sandbox. :meth:`close` deletes the
    snapshots (use ``async with``)."""

    def __init__(self, client: AsyncSandboxClient) -> None:
        self.client = client
        self.snapshots: dict[tuple[str, str], str] = {}
        self._locks: dict[tuple[str, str], asyncio.Lock] = {}
        self.supported = True

    async def sandbox(self, task: Task) -> tuple[AsyncSandbox, bool]:
        """A sandbox for an episode of ``task`` and whether it is set up: a copy of the task's set-up
        snapshot (made on first use), or a fresh sandbox for the caller to set up."""
        spec = task.family.sandbox
        if task.family.setup_in_files and self.supported:
            key = (task.family.name, task.id)
            async with self._locks.setdefault(key, asyncio.Lock()):
                if key not in self.snapshots and self.supported:
                    await self._snapshot(key, task)
            if key in self.snapshots:
                return await self.client.create(from_snapshot=self.snapshots[key], **spec), True
        return await self.client.create(**spec), False

    async def _snapshot(self, key: tuple[str, str], task: Task) -> None:
        template = await self.client.create(**task.family.sandbox)
        try:
            await task.setup(template)
            self.snapshots[key] = (await template.snapshot()).id
        except Unsupported:
            log.info("the backend keeps no snapshots: every episode sets up its own sandbox")
            self.supported = False
        finally:
            await delete_sandbox(template)

    async def close(self) -> None:
        for snapshot in self.snapshots.values():
            try:
                await self.client.delete_snapshot(snapshot)
            except OrchardError as exc:
                log.warning("could not delete set-up snapshot %s: %s", snapshot, exc)
        self.snapshots.clear()

    async def __aenter__(self) -> SetupCache:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()


class SandboxPool:
    """Sandboxes kept between episodes of ``reusable`` families (one browser per sandbox, a fresh
    context per episode), at most ``size`` idle ones per family.

    An episode borrows an idle sandbox of its family (or creates one), sets the task up in it (the
    set-up resets it), runs and grades in place. The sandbox goes back to the pool only after an
    episode that ended cleanly; after a sandbox error, a time-out or any exception it is deleted,
    so a crashed or hung browser never serves another episode. :meth:`close` deletes the idle ones
    (use ``async with``). Without a pool, every episode has a sandbox of its own: the paper's setting.
    """

    def __init__(self, size: int = 8) -> None:
        if size < 1:
            raise ValueError(f"a pool keeps at least one sandbox, got size={size}")
        self.size = size
        self.idle: dict[str, list[AsyncSandbox]] = {}

    async def borrow(self, client: AsyncSandboxClient, task: Task) -> tuple[AsyncSandbox, bool]:
        """An idle sandbox of the task's family that is still there, or a new one; never set up (the task's
        set-up resets it).

        An idle sandbox is asked for a heartbeat first, which also restarts its TTL: one kept while the event
        loop was busy elsewhere (a training stage between evaluations runs longer than the TTL) missed its
        client's heartbeats and was reaped by the orchestrator. Such a sandbox is dropped, not handed out.
        """
        spare = self.idle.get(task.family.name, [])
        while spare:
            box = spare.pop()
            try:
                await box.heartbeat()
            except SandboxNotFound:
                log.info("pooled sandbox %s is gone (reaped while idle): dropped", box.id)
                continue
            return box, False
        return await client.create(**task.family.sandbox), False

    async def give_back(self, box: AsyncSandbox, task: Task, clean_end: bool) -> None:
        """Keep ``box`` for a later episode if its episode ended cleanly and there is room; else delete it."""
        pooled = self.idle.setdefault(task.family.name, [])
        if clean_end and len(pooled) < self.size:
            pooled.append(box)
        else:
            await delete_sandbox(box)

    async def close(self) -> None:
        for boxes in self.idle.values():
            for box in boxes:
                await delete_sandbox(box)
        self.idle.clear()

    async def __aenter__(self) -> SandboxPool:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()


def failed_episode(task: Task, harness: Harness, policy: Policy, seed: int, error: BaseException,
                   metadata: dict[str, Any] | None = None) -> Trajectory:
    """The trajectory of an episode that broke outside the policy: aborted, reward ``None``."""
    return Trajectory(task_id=task.id, policy=policy.name, harness=harness.name, messages=[],
                      outcome=Outcome(reward=None, status="aborted"),
                      metadata={**(metadata or {}), "end_reason": EndReason.SANDBOX_ERROR, "seed": seed,
                                "error": f"{type(error).__name__}: {error}"})


class EpisodeRunner:
    """Graded episodes, at most ``concurrency`` sandboxes at a time.

    ``harness`` and ``policy`` are the defaults of every episode (each call may name others);
    ``limits`` (default: each task family's) bound the agent loop; ``episode_seconds`` bounds a
    whole episode, set-up and grading included (``None``: no bound); ``setups`` forks episodes from
    their tasks' set-up snapshots; ``pool`` keeps the sandboxes of reusable families between
    episodes. :meth:`run_one` never raises
    for one episode's failure (see the module docstring); cancellation still propagates.
    """

    def __init__(self, client: AsyncSandboxClient, harness: Harness | None = None, policy: Policy | None = None, *,
                 concurrency: int = 4, limits: Limits | None = None, episode_seconds: float | None = None,
                 setups: SetupCache | None = None, pool: SandboxPool | None = None) -> None:
        if concurrency < 1:
            raise ValueError(f"concurrency must be at least 1, got {concurrency}")
        if episode_seconds is not None and not episode_seconds > 0:
            raise ValueError(f"episode_seconds must be positive or None, got {episode_seconds}")
        self.client, self.harness, self.policy, self.limits = client, harness, policy, limits
        self.gate = asyncio.Semaphore(concurrency)
        self.episode_seconds, self.setups, self.pool = episode_seconds, setups, pool

    async def run_one(self, task: Task, seed: int, *, harness: Harness | None = None, policy: Policy | None = None,
                      metadata: dict[str, Any] | None = None) -> Trajectory:
        """One graded episode of ``task`` with episode seed ``seed``."""
        harness, policy = harness or self.harness, policy or self.policy
        if harness is None or policy is None:
            raise ValueError("an episode needs a harness and a policy: give them to the runner or to run_one")
        async with self.gate:
            try:
                async with asyncio.timeout(self.episode_seconds):
                    return await run_episode(self.client, harness, policy, task, limits=self.limits, seed=seed,
                                             metadata=metadata, setups=self.setups, pool=self.pool)
            except Exception as exc:  # TimeoutError included: the sandbox or the grader, not the policy
                log.warning("episode %s/%d failed: %s: %s", task.id, seed, type(exc).__name__, exc)
                return failed_episode(task, harness, policy, seed, exc, metadata)
