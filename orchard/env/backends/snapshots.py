"""Snapshots of local sandboxes: a copy of what a sandbox changed, that new sandboxes start from.

A local sandbox's root is an overlay: a base (the host's ``/`` or an image's cached root) below,
the sandbox's private writable layer (``rw/upper/``) above. Everything the sandbox changed is in that
layer, whiteouts (deletions) and opaque-directory markers included, plus the private directories
that hide host paths (``/tmp``, ``/root``, ``/home``...), which are bind mounts. A snapshot copies
both, while the sandbox's cgroup is frozen so that nothing moves meanwhile, into
``<state_dir>/snapshots/<id>/``; a sandbox created from it gets its own copy of them as its
writable layer, over the same base. So a snapshot costs the size of what changed, not of the
whole tree, and copies share blocks where the filesystem has reflinks.

Why copies, not stacked read-only layers: overlayfs refuses a lower layer that lies inside another
lower layer ("overlapping lowerdir path"), and with the host's ``/`` as the base every directory
on its filesystem does. A new sandbox therefore never depends on its snapshot, which can be
deleted at any time.

Each snapshot's ``meta.json`` also keeps what a new sandbox needs besides the files: the image,
the working directory and the command environment (:class:`RootSpec`).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import time
import uuid
from dataclasses import asdict, dataclass, field

from orchard.env.api import ErrorCode, SnapshotInfo
from orchard.env.backends.base import BackendError

ROOT_SPEC_FILE = "root.json"  # in each sandbox's directory
COPIED = ("upper", "private")  # what a snapshot holds of a sandbox's writable directory, rw/


@dataclass
class RootSpec:
    """What a sandbox's root is besides its files: the base image, the workdir, the environment."""

    image: str | None = None
    workdir: str = "/workspace"
    env: dict[str, str] = field(default_factory=dict)

    def save(self, sandbox_dir: str) -> None:
        with open(os.path.join(sandbox_dir, ROOT_SPEC_FILE), "w") as handle:
            json.dump(asdict(self), handle)

    @classmethod
    def load(cls, sandbox_dir: str) -> RootSpec | None:
        try:
            with open(os.path.join(sandbox_dir, ROOT_SPEC_FILE)) as handle:
                return cls(**json.load(handle))
        except (FileNotFoundError, json.JSONDecodeError, TypeError):
            return None


def _copy_tree(source: str, target: str) -> None:
    """``cp -a``: modes, owners, times, xattrs (the overlay's opaque markers) and device nodes (its
    whiteouts), with reflinks where the filesystem has them."""
    done = subprocess.run(["cp", "-a", "--reflink=auto", source, target], capture_output=True, text=True)
    if done.returncode != 0:
        full = "No space" in done.stderr or "quota" in done.stderr.lower()
        raise BackendError(f"could not copy the sandbox's files: {done.stderr.strip()[-500:]}", 507 if full else 503,
                           ErrorCode.NO_SPACE if full else ErrorCode.BACKEND_ERROR)


def _size(path: str) -> int:
    total = 0
    for directory, _, files in os.walk(path):
        for name in files:
            with contextlib.suppress(FileNotFoundError):
                total += os.lstat(os.path.join(directory, name)).st_size
    return total


class SnapshotStore:
    """The snapshots of one local backend, under ``<state_dir>/snapshots``."""

    def __init__(self, state_dir: str) -> None:
        self.root = os.path.join(state_dir, "snapshots")
        os.makedirs(self.root, exist_ok=True)

    def _dir(self, snapshot_id: str) -> str:
        if not (len(snapshot_id) == 32 and snapshot_id.isalnum()):
            raise BackendError(f"no snapshot {snapshot_id!r}", 404, ErrorCode.SNAPSHOT_NOT_FOUND)
        return os.path.join(self.root, snapshot_id)

    def get(self, snapshot_id: str) -> tuple[SnapshotInfo, RootSpec]:
        try:
            with open(os.path.join(self._dir(snapshot_id), "meta.json")) as handle:
                meta = json.load(handle)
        except FileNotFoundError:
            raise BackendError(f"no snapshot {snapshot_id!r}", 404, ErrorCode.SNAPSHOT_NOT_FOUND) from None
        return SnapshotInfo(**meta["info"]), RootSpec(**meta["root"])

    def capture(self, sandbox_id: str, sandbox_dir: str) -> SnapshotInfo:
        """Copy ``sandbox_dir``'s writable layer and private directories into a new snapshot (the
        caller freezes the sandbox around this)."""
        root = RootSpec.load(sandbox_dir)
        if root is None:
            raise BackendError(f"sandbox {sandbox_id!r} has no overlay root to snapshot (isolation='none')", 409,
                               ErrorCode.INVALID_REQUEST)
        snapshot_id = uuid.uuid4().hex
        staging = os.path.join(self.root, f".{snapshot_id}")
        os.makedirs(staging)
        try:
            for name in COPIED:
                _copy_tree(os.path.join(sandbox_dir, "rw", name), os.path.join(staging, name))
            info = SnapshotInfo(id=snapshot_id, source=sandbox_id, created_at=time.time(),
                                size_bytes=_size(staging), image=root.image)
            with open(os.path.join(staging, "meta.json"), "w") as handle:
                json.dump({"info": info.model_dump(), "root": asdict(root)}, handle)
            os.rename(staging, os.path.join(self.root, snapshot_id))
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise
        return info

    def seed(self, snapshot_id: str, sandbox_dir: str) -> None:
        """Give a new sandbox its own copy of the snapshot's files."""
        for name in COPIED:
            target = os.path.join(sandbox_dir, "rw", name)
            shutil.rmtree(target, ignore_errors=True)
            _copy_tree(os.path.join(self._dir(snapshot_id), name), target)

    def list(self) -> list[SnapshotInfo]:
        found = []
        for entry in sorted(os.listdir(self.root)):
            if not entry.startswith("."):
                with contextlib.suppress(BackendError):
                    found.append(self.get(entry)[0])
        return found

    def delete(self, snapshot_id: str) -> None:
        self.get(snapshot_id)  # 404 if unknown
        shutil.rmtree(self._dir(snapshot_id), ignore_errors=True)
