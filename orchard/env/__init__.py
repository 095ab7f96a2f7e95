"""Orchard Env: sandboxes for agents. ``pip install orchard[env]``; depends on nothing else in orchard.

The public names are imported lazily, so that the in-sandbox agent (``orchard.env.agent``), which
starts once per sandbox, does not pay for importing the SDK and its HTTP client.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

_EXPORTS = {
    "AsyncSandbox": "orchard.env.client",
    "AsyncSandboxClient": "orchard.env.client",
    "AuthenticationError": "orchard.env.client",
    "CommandFailed": "orchard.env.client",
    "ExecResult": "orchard.env.client",
    "InvalidRequest": "orchard.env.client",
    "OrchardConnectionError": "orchard.env.client",
    "OrchardError": "orchard.env.client",
    "PathNotFound": "orchard.env.client",
    "PathOutsideSandbox": "orchard.env.client",
    "PermissionDenied": "orchard.env.client",
    "Sandbox": "orchard.env.client",
    "SandboxClient": "orchard.env.client",
    "SandboxNotFound": "orchard.env.client",
    "StreamChunk": "orchard.env.client",
    "Endpoint": "orchard.env.local",
    "LocalServer": "orchard.env.local",
    "local_server": "orchard.env.local",
    "orchestrator": "orchard.env.local",
}
__all__ = [
    "AsyncSandbox",
    "AsyncSandboxClient",
    "AuthenticationError",
    "CommandFailed",
    "Endpoint",
    "ExecResult",
    "InvalidRequest",
    "LocalServer",
    "OrchardConnectionError",
    "OrchardError",
    "PathNotFound",
    "PathOutsideSandbox",
    "PermissionDenied",
    "Sandbox",
    "SandboxClient",
    "SandboxNotFound",
    "StreamChunk",
    "local_server",
    "orchestrator",
]

if TYPE_CHECKING:
    from orchard.env.client import (
        AsyncSandbox,
        AsyncSandboxClient,
        AuthenticationError,
        CommandFailed,
        ExecResult,
        InvalidRequest,
        OrchardConnectionError,
        OrchardError,
        PathNotFound,
        PathOutsideSandbox,
        PermissionDenied,
        Sandbox,
        SandboxClient,
        SandboxNotFound,
        StreamChunk,
    )
    from orchard.env.local import Endpoint, LocalServer, local_server, orchestrator


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'orchard.env' has no attribute {name!r}")
    value = getattr(importlib.import_module(_EXPORTS[name]), name)
    globals()[name] = value
    return value
