"""Background processes: servers and other long jobs that outlive one exec call.

Each process leads its own process group, with stdout and stderr appended to one log file under the
agent's state directory, so logs survive a slow reader and can be read from any byte offset.
"""

from __future__ import annotations

import os
import signal
import time
import uuid
from dataclasses import dataclass

from orchard.env.agent.children import kill_group, spawn
from orchard.env.api import ErrorCode, ProcessInfo
from orchard.env.problems import ProblemError


@dataclass
class _Process:
    id: str
    name: str | None
    pid: int
    log_path: str
    started_at: float
    exit_code: int | None = None
    ended_at: float | None = None

    def info(self) -> ProcessInfo:
        try:
            log_bytes = os.path.getsize(self.log_path)
        except FileNotFoundError:
            log_bytes = 0
        return ProcessInfo(id=self.id, name=self.name, pid=self.pid, running=self.ended_at is None,
                           exit_code=self.exit_code, started_at=self.started_at, ended_at=self.ended_at,
                           log_bytes=log_bytes)


class ProcessTable:
    def __init__(self, log_dir: str) -> None:
        self.log_dir = log_dir
        self._processes: dict[str, _Process] = {}
        os.makedirs(log_dir, exist_ok=True)

    def start(self, command: str | list[str], *, cwd: str, env: dict[str, str], name: str | None) -> ProcessInfo:
        process_id = uuid.uuid4().hex[:12]
        log_path = os.path.join(self.log_dir, f"{process_id}.log")
        log_fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o644)
        null_fd = os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC)
        try:
            pid, exited = spawn(command, cwd=cwd, env=env, stdin=null_fd, stdout=log_fd, stderr=log_fd)
        finally:
            os.close(log_fd)
            os.close(null_fd)
        process = _Process(process_id, name, pid, log_path, time.time())
        self._processes[process_id] = process

        def _ended(future) -> None:
            process.exit_code = future.result()
            process.ended_at = time.time()

        exited.add_done_callback(_ended)
        return process.info()

    def get(self, process_id: str) -> _Process:
        try:
            return self._processes[process_id]
        except KeyError:
            raise ProblemError(404, ErrorCode.PROCESS_NOT_FOUND, f"no process {process_id!r}") from None

    def list(self) -> list[ProcessInfo]:
        return [p.info() for p in self._processes.values()]

    def kill(self, process_id: str, sig: int = signal.SIGKILL) -> ProcessInfo:
        if sig not in signal.valid_signals() or sig <= 0:
            raise ProblemError(400, ErrorCode.INVALID_REQUEST, f"invalid signal {sig}")
        process = self.get(process_id)
        if process.ended_at is None:
            kill_group(process.pid, sig)
        return process.info()

    def read_log(self, process_id: str, offset: int, limit: int) -> tuple[bytes, int]:
        """Up to ``limit`` bytes of the log from ``offset``; returns (data, next offset)."""
        if offset < 0 or limit <= 0:
            raise ProblemError(400, ErrorCode.INVALID_REQUEST, "offset must be >= 0 and limit > 0")
        process = self.get(process_id)
        with open(process.log_path, "rb") as handle:
            handle.seek(offset)
            data = handle.read(min(limit, 16 << 20))
        return data, offset + len(data)

    def kill_all(self) -> None:
        for process in self._processes.values():
            if process.ended_at is None:
                kill_group(process.pid)
