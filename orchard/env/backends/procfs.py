"""What ``/proc`` says of a process, for the local backend's liveness checks."""

from __future__ import annotations


def start_time(pid: int) -> int | None:
    """The start time in clock ticks of a live process (guards against pid reuse); None once it has
    exited, zombies included: a launcher whose orchestrator died is reaped by whoever adopted it,
    maybe never."""
    try:
        with open(f"/proc/{pid}/stat") as handle:
            fields = handle.read().rsplit(")", 1)[1].split()
    except (FileNotFoundError, ProcessLookupError):
        return None
    try:
        return None if fields[0] in ("Z", "X") else int(fields[19])
    except (IndexError, ValueError):
        return None
