"""What every GUI task family asks of the layers below: one browser's sandbox and the paper's limits."""

from __future__ import annotations

from orchard.harness.core import Limits
from orchard.harness.task import TaskFamily


def browser_family(name: str) -> TaskFamily:
    """A GUI family: a sandbox for one browser (Chromium's processes and threads want more pids than
    a shell task, and memory for its renderer; no network, since the pages are files or servers on the
    sandbox's loopback), 15 steps (the paper's first curriculum stage), and ``reusable``: the set-up
    opens a fresh browser context, so a pool may keep the sandbox between episodes."""
    return TaskFamily(name=name, sandbox={"cpu": 1.0, "memory": "2Gi", "pids": 1024, "network": "none", "ttl": 600.0},
                      limits=Limits(max_turns=15, time_limit=300.0, max_format_errors=3), reusable=True)
