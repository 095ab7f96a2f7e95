"""Per-sandbox resource limits with cgroups (v2 or v1), or rlimits where cgroups are out of reach.

A sandbox gets one cgroup per controller it needs (``memory``, ``pids``, ``cpu``). Its launcher
process joins them before it creates any namespace, so every process of the sandbox is counted,
and deleting the sandbox can kill exactly the processes left in its cgroup.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import time
from collections.abc import Iterator
from dataclasses import dataclass

log = logging.getLogger(__name__)

CGROUP_ROOT = "/sys/fs/cgroup"
CPU_PERIOD_US = 100_000


@dataclass(frozen=True)
class Limits:
    memory_bytes: int
    pids: int
    cpu: float


def _write(path: str, value: str) -> None:
    with open(path, "w") as handle:
        handle.write(value)


class CgroupManager:
    """Creates, fills and removes the cgroups of sandboxes under ``<root>/<group>/``."""

    def __init__(self, group: str = "orchard", root: str = CGROUP_ROOT) -> None:
        self.group = group
        self.root = root
        self.version = 2 if os.path.exists(os.path.join(root, "cgroup.controllers")) else 1
        self.available = self._prepare()

    def _bases(self) -> dict[str, str]:
        if self.version == 2:
            return {"unified": os.path.join(self.root, self.group)}
        controllers = ["memory", "pids", "cpu"]
        if os.path.isdir(os.path.join(self.root, "freezer")):  # optional: only snapshots use it
            controllers.append("freezer")
        return {c: os.path.join(self.root, c, self.group) for c in controllers}

    def _prepare(self) -> bool:
        """Whether this process may create cgroups here; nothing is created until a sandbox needs it."""
        parents = [os.path.dirname(base) for base in self._bases().values()]
        if all(os.path.isdir(p) and os.access(p, os.W_OK) for p in parents):
            return True
        log.warning("cgroups under %s are not writable; falling back to rlimits", self.root)
        return False

    def paths(self, sandbox_id: str) -> dict[str, str]:
        return {c: os.path.join(base, sandbox_id) for c, base in self._bases().items()}

    def create(self, sandbox_id: str, limits: Limits) -> list[str]:
        """Create the sandbox's cgroups; return the ``cgroup.procs`` files its launcher must join."""
        paths = self.paths(sandbox_id)
        if self.version == 2:
            os.makedirs(self._bases()["unified"], exist_ok=True)
            _write(os.path.join(self._bases()["unified"], "cgroup.subtree_control"), "+memory +pids +cpu")
        for path in paths.values():
            os.makedirs(path, exist_ok=True)
        quota = max(1000, int(limits.cpu * CPU_PERIOD_US))
        if self.version == 2:
            unified = paths["unified"]
            _write(os.path.join(unified, "memory.max"), str(limits.memory_bytes))
            with contextlib.suppress(OSError):
                _write(os.path.join(unified, "memory.swap.max"), "0")
            _write(os.path.join(unified, "pids.max"), str(limits.pids))
            _write(os.path.join(unified, "cpu.max"), f"{quota} {CPU_PERIOD_US}")
        else:
            _write(os.path.join(paths["memory"], "memory.limit_in_bytes"), str(limits.memory_bytes))
            _write(os.path.join(paths["pids"], "pids.max"), str(limits.pids))
            _write(os.path.join(paths["cpu"], "cpu.cfs_period_us"), str(CPU_PERIOD_US))
            _write(os.path.join(paths["cpu"], "cpu.cfs_quota_us"), str(quota))
        return [os.path.join(path, "cgroup.procs") for path in paths.values()]

    @contextlib.contextmanager
    def frozen(self, sandbox_id: str, timeout: float = 5.0) -> Iterator[bool]:
        """Freeze every process of the sandbox for the block (cgroup v2's ``cgroup.freeze``, or v1's
        freezer controller), so that its files hold still while they are copied; yields whether it
        could."""
        paths = self.paths(sandbox_id)
        if not self.available or not ({"unified", "freezer"} & set(paths)):
            yield False
            return
        if self.version == 2:  # cgroup.freeze, and cgroup.events says when it holds
            control, state = os.path.join(paths["unified"], "cgroup.freeze"), os.path.join(paths["unified"],
                                                                                           "cgroup.events")
            freeze, thaw, frozen = "1", "0", "frozen 1"
        else:  # the v1 freezer controller
            control = state = os.path.join(paths["freezer"], "freezer.state")
            freeze, thaw, frozen = "FROZEN", "THAWED", "FROZEN"
        try:
            _write(control, freeze)
        except OSError:
            yield False
            return
        try:
            deadline = time.monotonic() + timeout
            while time.monotonic() < deadline:
                with open(state) as handle:
                    if frozen in handle.read():
                        break
                time.sleep(0.002)
            yield True
        finally:
            with contextlib.suppress(OSError):
                _write(control, thaw)

    def pids(self, sandbox_id: str) -> set[int]:
        found: set[int] = set()
        for path in self.paths(sandbox_id).values():
            # ENODEV: the cgroup is being removed (a concurrent delete), so it has no processes left.
            with contextlib.suppress(OSError), open(os.path.join(path, "cgroup.procs")) as handle:
                found.update(int(line) for line in handle if line.strip())
        return found

    def kill(self, sandbox_id: str) -> bool:
        """SIGKILL every process in the sandbox's cgroups; whether there were any."""
        pids = self.pids(sandbox_id)
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        return bool(pids)

    async def kill_and_remove(self, sandbox_id: str, timeout: float = 5.0) -> None:
        """SIGKILL every process in the sandbox's cgroups until none is left, then remove them. Waits
        without holding a thread: a thousand deletes at once all wait together."""
        deadline = time.monotonic() + timeout
        delay = 0.001
        while self.kill(sandbox_id) and time.monotonic() < deadline:
            await asyncio.sleep(delay)
            delay = min(delay * 2, 0.02)
        for path in self.paths(sandbox_id).values():
            with contextlib.suppress(FileNotFoundError, OSError):
                os.rmdir(path)

    def remove_group(self) -> None:
        """Remove this manager's (empty) group directories; sandboxes still running keep them."""
        for base in self._bases().values():
            with contextlib.suppress(OSError):
                os.rmdir(base)

    def list(self) -> set[str]:
        """Sandbox ids that still have cgroups (used to find leaks)."""
        found: set[str] = set()
        for base in self._bases().values():
            with contextlib.suppress(FileNotFoundError):
                found.update(e.name for e in os.scandir(base) if e.is_dir())
        return found


def rlimit_argv(limits: Limits) -> list[str]:
    """A ``prlimit`` prefix: the fallback where cgroups cannot be written.

    Weaker than cgroups: the address-space limit applies to each process, not to the sandbox, and
    the process-count limit counts the user's processes everywhere (and does not bind root).
    """
    return ["prlimit", f"--as={limits.memory_bytes}", f"--nproc={limits.pids}"]
