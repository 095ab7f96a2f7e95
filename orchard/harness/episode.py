"""``run_episode``: one sandbox, one run of a harness in it, and the sandbox always deleted.

The sequence is create the sandbox, ``setup(sandbox)``, run the agent
(:func:`~orchard.harness.core.run_agent`), ``grade(sandbox, trajectory)``, delete. The delete is
in a ``finally``: it happens after a success, after any exception (from setup, the agent, the
grader) and after cancellation, and the exception then propagates unchanged. The delete itself
runs as a shielded task, so cancelling the caller again while it is in flight cannot stop it.

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
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from orchard.data.trajectory import Outcome, Trajectory
from orchard.env.client import AsyncSandbox, AsyncSandboxClient
from orchard.harness.core import Harness, Limits, Policy, run_agent

log = logging.getLogger(__name__)
DEFAULT_SANDBOX: dict[str, Any] = {"cpu": 1.0, "memory": "2Gi", "ttl": 300.0}

Setup = Callable[[AsyncSandbox], Awaitable[None]]
Grade = Callable[[AsyncSandbox, Trajectory], Awaitable[Outcome]]

_deleting: set[asyncio.Task] = set()  # strong references, so a pending delete is never garbage-collected


async def run_episode(client: AsyncSandboxClient, harness: Harness, policy: Policy, task: str, *,
                      task_id: str = "task", limits: Limits = Limits(), setup: Setup | None = None,
                      grade: Grade | None = None, sandbox_spec: Mapping[str, Any] | None = None,
                      seed: int | None = None, metadata: dict[str, Any] | None = None) -> Trajectory:
    """Create a sandbox (``sandbox_spec``: :class:`~orchard.env.api.SandboxSpec` fields over
    :data:`DEFAULT_SANDBOX`), set it up, run ``harness`` with ``policy`` on ``task``, grade, and
    delete the sandbox whatever happens.

    ``grade``'s outcome replaces the trajectory's, except its status, which stays the run's.
    """
    box = await client.create(**{**DEFAULT_SANDBOX, **(sandbox_spec or {})})
    try:
        if setup is not None:
            await setup(box)
        trajectory = await run_agent(harness, policy, box, task, limits=limits, task_id=task_id, seed=seed,
                                     metadata=metadata)
        if grade is not None:
            outcome = await grade(box, trajectory)
            trajectory.outcome = outcome.model_copy(update={"status": trajectory.outcome.status})
        return trajectory
    finally:
        await _delete(box)


async def _delete(box: AsyncSandbox) -> None:
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
