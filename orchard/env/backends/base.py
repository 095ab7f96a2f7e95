"""The backend contract: the cold path (create, delete, list, recover). The hot path is the agent's.

A backend starts the same agent program everywhere and tells the orchestrator how to reach it
(``agent_url``, with the per-sandbox ``agent_token``). Everything it needs to find a sandbox again
after an orchestrator restart goes into ``handle.data``, which the store keeps.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

from orchard.env.api import ErrorCode, SandboxSpec, SnapshotInfo
from orchard.env.problems import ProblemError

# The capabilities processes in a sandbox keep, in every backend: Docker's default set, less mknod.
# Lower-case, without the CAP_ prefix (the local backend's setpriv spelling; Kubernetes wants them
# upper-case, and its pods leave out net_raw).
SANDBOX_CAPS = ("chown", "dac_override", "fowner", "fsetid", "kill", "setgid", "setuid", "setpcap",
                "net_bind_service", "net_raw", "sys_chroot", "audit_write", "setfcap")


@dataclass
class SandboxHandle:
    id: str
    agent_url: str  # "unix:///path/agent.sock" or "http://host:port"
    agent_token: str
    data: dict = field(default_factory=dict)


class BackendError(ProblemError):
    def __init__(self, detail: str, status: int = 503, code: ErrorCode = ErrorCode.BACKEND_ERROR) -> None:
        super().__init__(status, code, detail)


class Backend(Protocol):
    name: str

    async def create(self, sandbox_id: str, spec: SandboxSpec) -> SandboxHandle:
        """Start a sandbox; return once its agent has been launched (not necessarily ready)."""
        ...

    async def failure(self, handle: SandboxHandle) -> str | None:
        """Why a sandbox that is not answering has died, or None while it may still come up."""
        ...

    async def delete(self, handle_or_id: SandboxHandle | str) -> None:
        """Kill every process of the sandbox and remove its files. Idempotent."""
        ...

    async def list(self) -> set[str]:
        """Ids of the sandboxes this backend still has resources for (to find leaks)."""
        ...

    async def alive(self, handle: SandboxHandle) -> bool:
        """Whether a sandbox found in the store after a restart is still running."""
        ...

    async def snapshot(self, sandbox_id: str) -> SnapshotInfo:
        """Capture the sandbox's files; ``SandboxSpec.from_snapshot`` starts new sandboxes from them."""
        ...

    async def list_snapshots(self) -> list[SnapshotInfo]: ...

    async def delete_snapshot(self, snapshot_id: str) -> None:
        """Remove a snapshot (sandboxes made from it keep their own copies)."""
        ...

    async def close(self) -> None: ...
