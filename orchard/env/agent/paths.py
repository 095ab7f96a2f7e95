"""Confining API paths to the sandbox's root.

The agent serves one directory tree, its *root*. Inside an isolated sandbox the root is ``/``
(the sandbox's own private root after ``pivot_root``). With ``isolation="none"`` it is the
sandbox's directory on the host, and API paths are read as if that directory were ``/``.

A path is refused with ``path_outside_sandbox`` when ``..`` climbs above the root or when a
symlink on the way leads out of it. Paths are checked by resolving them, and files are then
opened with ``O_NOFOLLOW`` on the last component, so a symlink swapped in at the last moment is
not followed either.
"""

from __future__ import annotations

import os
import posixpath

from orchard.env.api import ErrorCode
from orchard.env.problems import ProblemError


class SandboxRoot:
    def __init__(self, root: str, workdir: str = "/workspace") -> None:
        self.root = os.path.realpath(root)
        self.workdir = workdir

    def _outside(self, path: str) -> ProblemError:
        return ProblemError(403, ErrorCode.PATH_OUTSIDE_SANDBOX, f"{path!r} leads outside the sandbox")

    def host_path(self, path: str, *, follow_last: bool = True) -> str:
        """Map an API path (absolute, or relative to the workdir) to a checked real path.

        With ``follow_last=False`` the last component is not resolved, so that a symlink itself
        can be stat'ed, replaced or deleted.
        """
        if not path or "\0" in path:
            raise ProblemError(400, ErrorCode.INVALID_REQUEST, "path must be non-empty and without NUL bytes")
        absolute = path if path.startswith("/") else posixpath.join(self.workdir, path)
        depth = 0
        for part in absolute.split("/"):
            if part in ("", "."):
                continue
            depth = depth - 1 if part == ".." else depth + 1
            if depth < 0:
                raise self._outside(path)
        relative = posixpath.normpath(absolute).lstrip("/")
        joined = os.path.join(self.root, relative) if relative else self.root
        if follow_last or joined == self.root:
            real = os.path.realpath(joined)
        else:
            real = os.path.join(os.path.realpath(os.path.dirname(joined)), os.path.basename(joined))
        if real != self.root and not real.startswith(self.root.rstrip("/") + "/"):
            raise self._outside(path)
        return real

    def api_path(self, real: str) -> str:
        """The API path of a real path under the root."""
        if self.root == "/":
            return real
        return "/" + os.path.relpath(real, self.root).removeprefix(".")

    def workdir_path(self, cwd: str | None) -> str:
        """The host directory for a command's ``cwd`` (default: the workdir)."""
        real = self.host_path(cwd or self.workdir)
        if not os.path.isdir(real):
            raise ProblemError(400, ErrorCode.NOT_A_DIRECTORY, f"cwd {cwd or self.workdir!r} is not a directory")
        return real
