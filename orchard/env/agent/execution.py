"""Running one command: pipes, output caps, stdin, timeouts and streaming.

One code path serves both ``/exec`` (buffered, capped) and ``/exec/stream`` (chunks as they come):
:func:`run` pumps each pipe into an async *sink*. The buffered sink keeps at most
``max_output_bytes`` per stream (half from the start, half from the end, with a marker in
between), so memory stays bounded however much a command prints. The streaming sink is a bounded
queue, so a slow reader slows the command down through the pipe instead of filling memory.

A command is finished when its main process has exited. Its pipes are then drained for a short
grace period; a background child that still holds them open (``sleep 1000 &``) does not keep the
call waiting. A command that closes stdout early but keeps running is waited for until it exits.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import fcntl
import os
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from orchard.env.agent.children import kill_group, spawn

Sink = Callable[[bytes], Awaitable[None]]

CHUNK = 1 << 16
EOF_GRACE = 0.2  # seconds to drain pipes after the main process exits
_F_SETPIPE_SZ = 1031
_PIPE_SIZE = 1 << 20


def truncation_marker(dropped: int) -> bytes:
    return f"\n[... orchard: {dropped} bytes truncated ...]\n".encode()


class CappedBuffer:
    """Keeps the first and last ``cap / 2`` bytes of a stream and counts the rest."""

    def __init__(self, cap: int) -> None:
        self.head_cap = cap // 2
        self.tail_cap = cap - self.head_cap
        self.head = bytearray()
        self.tail: collections.deque[bytes] = collections.deque()
        self.tail_size = 0
        self.total = 0

    async def write(self, data: bytes) -> None:
        self.total += len(data)
        room = self.head_cap - len(self.head)
        if room > 0:
            self.head += data[:room]
            data = data[room:]
        if not data or not self.tail_cap:
            return
        self.tail.append(data)
        self.tail_size += len(data)
        while self.tail_size - len(self.tail[0]) >= self.tail_cap:
            self.tail_size -= len(self.tail.popleft())

    @property
    def truncated(self) -> bool:
        return self.total > self.head_cap + self.tail_cap

    def getvalue(self) -> bytes:
        tail = b"".join(self.tail)[-self.tail_cap :] if self.tail_cap else b""
        if not self.truncated:
            return bytes(self.head) + tail
        dropped = self.total - len(self.head) - len(tail)
        return bytes(self.head) + truncation_marker(dropped) + tail


@dataclass
class Outcome:
    exit_code: int | None
    timed_out: bool
    duration: float


async def _pump(fd: int, sink: Sink) -> None:
    """Copy a non-blocking pipe into ``sink`` until EOF. The caller owns (and closes) ``fd``."""
    loop = asyncio.get_running_loop()
    readable = asyncio.Event()
    loop.add_reader(fd, readable.set)
    try:
        while True:
            await readable.wait()
            readable.clear()
            try:
                chunk = os.read(fd, CHUNK)
            except BlockingIOError:
                continue
            if not chunk:
                return
            await sink(chunk)
    finally:
        loop.remove_reader(fd)


async def _feed(fd: int, data: bytes, open_fds: set[int]) -> None:
    """Write ``data`` to a non-blocking pipe, then close it (EOF); a reader that goes away is fine."""
    loop = asyncio.get_running_loop()
    writable = asyncio.Event()
    view = memoryview(data)
    loop.add_writer(fd, writable.set)
    try:
        while view:
            await writable.wait()
            writable.clear()
            try:
                view = view[os.write(fd, view) :]
            except BlockingIOError:
                continue
            except (BrokenPipeError, OSError):
                return
    finally:
        loop.remove_writer(fd)
        open_fds.discard(fd)
        os.close(fd)


def _output_pipe() -> tuple[int, int]:
    read_fd, write_fd = os.pipe2(os.O_CLOEXEC)
    with contextlib.suppress(OSError):
        fcntl.fcntl(read_fd, _F_SETPIPE_SZ, _PIPE_SIZE)
    os.set_blocking(read_fd, False)
    return read_fd, write_fd


async def run(
    command: str | list[str],
    *,
    cwd: str,
    env: dict[str, str],
    stdin: bytes | None,
    timeout: float,
    stdout_sink: Sink,
    stderr_sink: Sink,
) -> Outcome:
    """Run ``command`` to completion (or timeout), pumping its output into the sinks."""
    start = time.monotonic()
    out_r, out_w = _output_pipe()
    err_r, err_w = _output_pipe()
    if stdin:
        in_r, in_w = os.pipe2(os.O_CLOEXEC)
        os.set_blocking(in_w, False)
    else:
        in_r, in_w = os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC), -1
    open_fds = {out_r, err_r, in_w} - {-1}  # parent ends, closed once the command is done
    try:
        pid, exited = spawn(command, cwd=cwd, env=env, stdin=in_r, stdout=out_w, stderr=err_w)
    except BaseException:
        for fd in list(open_fds):
            os.close(fd)
        raise
    finally:
        for fd in (out_w, err_w, in_r):
            os.close(fd)

    pumps = [asyncio.ensure_future(_pump(out_r, stdout_sink)), asyncio.ensure_future(_pump(err_r, stderr_sink))]
    feeder = asyncio.ensure_future(_feed(in_w, stdin, open_fds)) if stdin else None
    timed_out = False

    def on_timeout() -> None:
        nonlocal timed_out
        timed_out = True
        kill_group(pid)

    timer = asyncio.get_running_loop().call_later(timeout, on_timeout)
    try:
        try:
            exit_code: int | None = await exited
        finally:
            timer.cancel()
        if not all(task.done() for task in pumps):
            _, pending = await asyncio.wait(pumps, timeout=EOF_GRACE)
            for task in pending:
                task.cancel()
    except BaseException:
        # The client went away (stream closed, request cancelled): leave nothing running.
        kill_group(pid)
        raise
    finally:
        for task in [*pumps, feeder]:
            if task is not None:
                task.cancel()
        await asyncio.gather(*pumps, *([feeder] if feeder else []), return_exceptions=True)
        for fd in list(open_fds):
            os.close(fd)
    return Outcome(exit_code=exit_code, timed_out=timed_out, duration=time.monotonic() - start)
