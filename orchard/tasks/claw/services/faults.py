"""Seeded fault injection: which calls fail, as a pure function of (seed, endpoint, call number).

Every endpoint (a route template such as ``POST /mail/messages/{id}/move``) counts its own calls. Call k
draws u from ``sha256(f"{seed}|{endpoint}|{k}")`` and fails when u < fault_rate; a second draw picks the
kind. The same seed and the same sequence of calls therefore meet the same faults, which is what makes n
samples of a task comparable.
"""

import hashlib
from collections import Counter

from .config import FaultKind


def uniform(key: str) -> float:
    """A number in [0, 1) that depends on ``key`` only."""
    digest = hashlib.sha256(key.encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64


class FaultInjector:
    """Counts calls per endpoint and decides, for each, which fault (if any) to inject."""

    def __init__(self, seed: int, rate: float, kinds: list[FaultKind]) -> None:
        self.seed = seed
        self.rate = rate
        self.kinds = kinds
        self.calls: Counter[str] = Counter()

    def next_fault(self, endpoint: str) -> FaultKind | None:
        """Count one more call to ``endpoint`` and return its fault, or None."""
        self.calls[endpoint] += 1
        key = f"{self.seed}|{endpoint}|{self.calls[endpoint]}"
        if not self.kinds or uniform(key) >= self.rate:
            return None
        return self.kinds[int(uniform(f"{key}|kind") * len(self.kinds))]
