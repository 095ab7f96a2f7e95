"""Run the SWE task code, written once against the async sandbox API, on a sync ``Sandbox``.

Setup and grading are written as coroutines over :class:`orchard.env.AsyncSandbox`, because
RL rollouts grade many sandboxes at once on one event loop. Their blocking twins hand a sync
:class:`orchard.env.Sandbox` to the same coroutine through :class:`AwaitableSandbox`, whose
methods call the blocking ones, and run it with :func:`asyncio.run` on a private loop that runs
nothing else, so the blocking calls stall no one. One code path, two faces; only the SDK's public
methods are used.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


class AwaitableSandbox:
    """A sync sandbox seen through the async API: ``await view.exec(...)`` calls ``sandbox.exec(...)``."""

    def __init__(self, sandbox: Any) -> None:
        self.sandbox = sandbox

    def __getattr__(self, name: str) -> Any:
        method = getattr(self.sandbox, name)
        if not callable(method):  # id, info: plain attributes pass through
            return method

        async def call(*args: Any, **kwargs: Any) -> Any:
            return method(*args, **kwargs)

        return call


def run_blocking(function: Callable[..., Coroutine[Any, Any, T]], sandbox: Any, *args: Any, **kwargs: Any) -> T:
    """``function(AwaitableSandbox(sandbox), *args, **kwargs)`` to completion, from sync code."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(function(AwaitableSandbox(sandbox), *args, **kwargs))
    name = getattr(function, "__name__", "the async function")
    raise RuntimeError(f"called the blocking API inside a running event loop: await {name}() instead")
