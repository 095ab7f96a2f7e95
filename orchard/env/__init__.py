"""Orchard Env: sandboxes for agents. ``pip install orchard[env]``; depends on nothing else in orchard."""

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
    Sandbox,
    SandboxClient,
    SandboxNotFound,
    StreamChunk,
)
from orchard.env.local import LocalServer, local_server

__all__ = [
    "AsyncSandbox",
    "AsyncSandboxClient",
    "AuthenticationError",
    "CommandFailed",
    "ExecResult",
    "InvalidRequest",
    "LocalServer",
    "OrchardConnectionError",
    "OrchardError",
    "PathNotFound",
    "PathOutsideSandbox",
    "Sandbox",
    "SandboxClient",
    "SandboxNotFound",
    "StreamChunk",
    "local_server",
]
