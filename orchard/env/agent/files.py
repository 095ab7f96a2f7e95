"""File operations of the agent: streamed upload and download, list, stat, delete and tar.

Bodies are raw bytes and are never held whole in memory: uploads are written chunk by chunk to a
temporary file beside the target and renamed into place, so a failed upload leaves the old file
untouched; downloads and tar archives are streamed out.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import queue
import shutil
import stat
import tarfile
import tempfile
import threading
from collections.abc import AsyncIterator, Iterator

from orchard.env.agent.paths import SandboxRoot
from orchard.env.api import ErrorCode, FileInfo
from orchard.env.problems import ProblemError

CHUNK = 1 << 18


def _not_found(path: str) -> ProblemError:
    return ProblemError(404, ErrorCode.PATH_NOT_FOUND, f"{path!r} does not exist")


def file_info(root: SandboxRoot, real: str) -> FileInfo:
    st = os.lstat(real)
    if stat.S_ISLNK(st.st_mode):
        kind, target = "symlink", os.readlink(real)
    else:
        kind = "dir" if stat.S_ISDIR(st.st_mode) else "file" if stat.S_ISREG(st.st_mode) else "other"
        target = None
    api_path = root.api_path(real)
    return FileInfo(path=api_path, name=os.path.basename(api_path) or "/", type=kind, size=st.st_size,
                    mode=stat.S_IMODE(st.st_mode), mtime=st.st_mtime, target=target)


def stat_path(root: SandboxRoot, path: str) -> FileInfo:
    real = root.host_path(path, follow_last=False)
    try:
        return file_info(root, real)
    except FileNotFoundError:
        raise _not_found(path) from None


def list_dir(root: SandboxRoot, path: str) -> list[FileInfo]:
    real = root.host_path(path)
    try:
        names = sorted(os.listdir(real))
    except FileNotFoundError:
        raise _not_found(path) from None
    except NotADirectoryError:
        raise ProblemError(400, ErrorCode.NOT_A_DIRECTORY, f"{path!r} is not a directory") from None
    infos = []
    for name in names:
        with contextlib.suppress(FileNotFoundError):  # removed while listing
            infos.append(file_info(root, os.path.join(real, name)))
    return infos


def delete_path(root: SandboxRoot, path: str) -> None:
    real = root.host_path(path, follow_last=False)
    if real == root.root:
        raise ProblemError(400, ErrorCode.INVALID_REQUEST, "refusing to delete the sandbox root")
    try:
        if os.path.isdir(real) and not os.path.islink(real):
            shutil.rmtree(real)
        else:
            os.unlink(real)
    except FileNotFoundError:
        raise _not_found(path) from None


def _parent_dir(root: SandboxRoot, path: str) -> tuple[str, str]:
    """The checked target (symlinks followed, so a link leading out is refused) and its created parent."""
    real = root.host_path(path)
    parent = os.path.dirname(real)
    try:
        os.makedirs(parent, exist_ok=True)
    except (FileExistsError, NotADirectoryError):
        raise ProblemError(400, ErrorCode.NOT_A_DIRECTORY, f"a parent of {path!r} is not a directory") from None
    if os.path.isdir(real):
        raise ProblemError(400, ErrorCode.IS_A_DIRECTORY, f"{path!r} is a directory")
    return real, parent


async def write_file(root: SandboxRoot, path: str, body: AsyncIterator[bytes], mode: int | None) -> FileInfo:
    real, parent = _parent_dir(root, path)
    if mode is None:
        try:
            mode = stat.S_IMODE(os.stat(real).st_mode)
        except FileNotFoundError:
            mode = 0o644
    fd, tmp = tempfile.mkstemp(prefix=".orchard-upload-", dir=parent)
    try:
        with os.fdopen(fd, "wb") as out:
            async for chunk in body:
                out.write(chunk)
        os.chmod(tmp, mode & 0o7777)
        os.replace(tmp, real)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    return file_info(root, real)


def open_for_read(root: SandboxRoot, path: str) -> tuple[int, int]:
    """Open a regular file for a streamed download; returns (fd, size)."""
    real = root.host_path(path)
    try:
        fd = os.open(real, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        raise _not_found(path) from None
    st = os.fstat(fd)
    if stat.S_ISDIR(st.st_mode):
        os.close(fd)
        raise ProblemError(400, ErrorCode.IS_A_DIRECTORY, f"{path!r} is a directory")
    return fd, st.st_size


def iter_fd(fd: int) -> Iterator[bytes]:
    with os.fdopen(fd, "rb") as handle:
        while chunk := handle.read(CHUNK):
            yield chunk


# ------------------------------------------------------------------------- tar


async def extract_tar(root: SandboxRoot, path: str, body: AsyncIterator[bytes]) -> FileInfo:
    """Extract a tar (plain, gzip, bz2 or xz) into directory ``path``.

    The body is spooled to a temporary file, then extracted with tarfile's ``data`` filter, which
    refuses ``..`` and links that leave the destination; absolute names are refused too.
    """
    dest = root.host_path(path)
    os.makedirs(dest, exist_ok=True)
    with tempfile.TemporaryFile(dir=dest) as spool:
        async for chunk in body:
            spool.write(chunk)
        spool.seek(0)
        await asyncio.to_thread(_extract, spool, dest)
    root.host_path(path)
    return file_info(root, dest)


def _strict_filter(member: tarfile.TarInfo, dest: str) -> tarfile.TarInfo:
    """tarfile's ``data`` filter, except that absolute names are refused rather than made relative."""
    if member.name.startswith("/"):
        raise tarfile.AbsolutePathError(member)
    return tarfile.data_filter(member, dest)


def _extract(spool, dest: str) -> None:
    try:
        with tarfile.open(fileobj=spool, mode="r:*") as archive:
            archive.extractall(dest, filter=_strict_filter)
    except tarfile.FilterError as exc:
        raise ProblemError(403, ErrorCode.PATH_OUTSIDE_SANDBOX, f"archive member refused: {exc}") from None
    except tarfile.TarError as exc:
        raise ProblemError(400, ErrorCode.INVALID_REQUEST, f"not a valid tar archive: {exc}") from None


class _QueueWriter:
    """A file-like sink that hands tar output to the event loop in bounded chunks."""

    def __init__(self, chunks: queue.Queue, cancelled: threading.Event) -> None:
        self.chunks = chunks
        self.cancelled = cancelled
        self.pending = bytearray()

    def write(self, data: bytes) -> int:
        self.pending += data
        if len(self.pending) >= CHUNK:
            self.flush()
        return len(data)

    def flush(self) -> None:
        if not self.pending:
            return
        while True:
            try:
                self.chunks.put(bytes(self.pending), timeout=0.5)
                break
            except queue.Full:
                if self.cancelled.is_set():
                    raise BrokenPipeError("download cancelled") from None
        self.pending.clear()


def tar_directory(root: SandboxRoot, path: str) -> AsyncIterator[bytes]:
    """Stream directory ``path`` as an uncompressed tar; members are relative to it."""
    real = root.host_path(path)
    if not os.path.isdir(real):
        raise _not_found(path) if not os.path.exists(real) else ProblemError(
            400, ErrorCode.NOT_A_DIRECTORY, f"{path!r} is not a directory")
    chunks: queue.Queue = queue.Queue(maxsize=8)
    cancelled = threading.Event()
    done = object()

    def produce() -> None:
        writer = _QueueWriter(chunks, cancelled)
        try:
            with tarfile.open(fileobj=writer, mode="w|") as archive:
                for name in sorted(os.listdir(real)):
                    archive.add(os.path.join(real, name), arcname=name)
            writer.flush()
        except BrokenPipeError:
            return
        finally:
            while not cancelled.is_set():
                with contextlib.suppress(queue.Full):
                    chunks.put(done, timeout=0.5)
                    break

    async def stream() -> AsyncIterator[bytes]:
        threading.Thread(target=produce, daemon=True, name="tar-download").start()
        try:
            while (chunk := await asyncio.to_thread(chunks.get)) is not done:
                yield chunk
        finally:
            cancelled.set()

    return stream()
