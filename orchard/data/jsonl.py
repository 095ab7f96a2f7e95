"""Append-only, crash-safe JSONL: the one writer and reader of records that must survive a kill.

:class:`JsonlWriter` appends each record with one ``write`` of a whole line, so a writer killed
mid-record leaves at most a torn last line; a writer opening such a file first moves the torn
fragment to ``<file>.torn``, so that later records never follow a broken line, and a short write
(a full disk) is undone rather than left half-written. :func:`read_jsonl` yields the records,
reports and skips a torn last line, and raises :class:`JsonlFormatError` naming the file and line
for any other line that is not JSON. Trajectories (:mod:`orchard.data.trajectory`) and the
recording proxy's call records (:mod:`orchard.rollout.proxy`) are stored this way.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

log = logging.getLogger(__name__)


class JsonlFormatError(ValueError):
    """A line of a JSONL file that is not a record (and not a torn last line)."""


@dataclass
class ReadReport:
    """What :func:`read_jsonl` skipped."""

    torn_line: int | None = None  # the 1-based number of a torn last line
    notes: list[str] = field(default_factory=list)


class JsonlWriter:
    """Append records to a JSONL file, one whole line per write; safe to kill at any time."""

    def __init__(self, path: str, fsync: bool = False) -> None:
        self.path, self.fsync = path, fsync
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        self._fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o644)
        self._set_aside_torn_tail()

    def _set_aside_torn_tail(self) -> None:
        size = os.fstat(self._fd).st_size
        if size == 0 or os.pread(self._fd, 1, size - 1) == b"\n":
            return
        chunk = min(size, 1 << 20)
        while True:  # find the start of the last (torn) line
            tail = os.pread(self._fd, chunk, size - chunk)
            cut = tail.rfind(b"\n")
            if cut >= 0 or chunk == size:
                start = size - chunk + cut + 1
                break
            chunk = min(size, chunk * 2)
        with open(self.path + ".torn", "ab") as aside:
            aside.write(os.pread(self._fd, size - start, start) + b"\n")
        os.ftruncate(self._fd, start)
        log.warning("%s ended in a torn record (%d bytes); moved it to %s.torn", self.path, size - start, self.path)

    def write_line(self, line: bytes) -> None:
        """Append one serialised record (without its newline)."""
        line = line + b"\n"
        written = os.write(self._fd, line)
        if written != len(line):  # a full disk: do not leave half a record
            os.ftruncate(self._fd, os.fstat(self._fd).st_size - written)
            raise OSError(f"short write to {self.path} ({written} of {len(line)} bytes)")
        if self.fsync:
            os.fsync(self._fd)

    def write_record(self, record: Any) -> None:
        """Append ``record`` (JSON-serialisable)."""
        self.write_line(json.dumps(record, separators=(",", ":"), default=str).encode())

    @property
    def closed(self) -> bool:
        return self._fd < 0

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def __enter__(self):
        return self

    def __exit__(self, *_: object) -> None:
        self.close()


def read_jsonl(path: str, report: ReadReport | None = None) -> Iterator[tuple[int, Any]]:
    """``(line number, record)`` of every record of ``path`` (see the module docstring)."""
    report = report if report is not None else ReadReport()
    with open(path, "rb") as handle:
        lines = handle.readlines()
    for number, raw in enumerate(lines, start=1):
        if not raw.strip():
            continue
        try:
            record = json.loads(raw)
        except json.JSONDecodeError as exc:
            if number == len(lines) and not raw.endswith(b"\n"):
                report.torn_line = number
                report.notes.append(f"{path}:{number}: torn last record ({len(raw)} bytes) skipped")
                log.warning(report.notes[-1])
                return
            raise JsonlFormatError(f"{path}:{number}: not JSON ({exc.msg} at column {exc.colno})") from exc
        yield number, record
