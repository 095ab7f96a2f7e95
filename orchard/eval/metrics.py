"""Evaluation metrics over graded episodes: resolve rate, avg@k, pass@k, pass^k, and the paired change.

Inputs are plain counts: for each task, ``n`` graded trials of which ``c`` passed. The functions
here are pure and know nothing of trajectories; :mod:`orchard.eval.runner` builds the counts.

* **resolve rate**: passed trials over all trials (what a single greedy pass reports);
* **avg@k**: the mean over tasks of each task's pass fraction ``c / n`` (with ``k`` trials a
  task, this is the rate RL's reward optimises);
* **pass@k**: the probability that at least one of ``k`` trials drawn without replacement from a
  task's ``n`` passes, with the unbiased estimator of Chen et al. (2021),
  ``1 - C(n - c, k) / C(n, k)``;
* **pass^k**: the probability that all ``k`` drawn trials pass, ``C(c, k) / C(n, k)``, as
  tau-bench and Claw-Eval's leaderboard define it ("3 of 3 trials pass"). Claw-Eval's own code
  estimates it as ``(c / n) ** k``, which is biased upwards for ``k > 1`` (with ``n = 3, c = 2``
  that gives 0.30 where the answer is 0);
* the **paired per-task change** between two evaluations of the same tasks, and the one-sided
  sign test of it: among the tasks whose rate changed, the chance of at least that many rising
  if each change were equally likely to go either way.

``n < k`` is a :class:`ValueError`: there are not ``k`` trials to draw.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

TaskTrials = Mapping[str, Sequence[bool]]  # task id -> the pass/fail of each of its trials


def _check(n: int, c: int, k: int) -> None:
    if k < 1:
        raise ValueError(f"k must be at least 1, got {k}")
    if not 0 <= c <= n:
        raise ValueError(f"need 0 <= c <= n, got c = {c}, n = {n}")
    if n < k:
        raise ValueError(f"pass@{k} and pass^{k} need at least {k} trials of a task, got {n}")


def pass_at_k(n: int, c: int, k: int) -> float:
    """P(at least one of ``k`` of the ``n`` trials passes), unbiased: ``1 - C(n-c, k) / C(n, k)``."""
    _check(n, c, k)
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def pass_hat_k(n: int, c: int, k: int) -> float:
    """pass^k: P(all ``k`` of ``k`` trials drawn from the ``n`` pass) = ``C(c, k) / C(n, k)``."""
    _check(n, c, k)
    return math.comb(c, k) / math.comb(n, k)


def resolve_rate(passed: Iterable[bool]) -> float:
    """Passed trials over all trials (0 when there are none)."""
    results = list(passed)
    return sum(results) / len(results) if results else 0.0


def _counts(trials: TaskTrials) -> list[tuple[int, int]]:
    if not trials:
        raise ValueError("no tasks to average over")
    return [(len(results), sum(bool(r) for r in results)) for results in trials.values()]


def avg_at_k(trials: TaskTrials) -> float:
    """The mean over tasks of each task's pass fraction."""
    return statistics.fmean(c / n for n, c in _counts(trials) if n) if any(trials.values()) else 0.0


def mean_pass_at_k(trials: TaskTrials, k: int) -> float:
    """pass@k averaged over tasks."""
    return statistics.fmean(pass_at_k(n, c, k) for n, c in _counts(trials))


def mean_pass_hat_k(trials: TaskTrials, k: int) -> float:
    """pass^k averaged over tasks."""
    return statistics.fmean(pass_hat_k(n, c, k) for n, c in _counts(trials))


def sign_test(up: int, down: int) -> float:
    """One-sided sign test: P(at least ``up`` of ``up + down`` fair coin flips land up); 1 with no flips."""
    if up < 0 or down < 0:
        raise ValueError(f"counts must not be negative, got {up} up and {down} down")
    changed = up + down
    return sum(math.comb(changed, i) for i in range(up, changed + 1)) / 2**changed


@dataclass(frozen=True)
class PairedChange:
    """How the per-task rate moved between two evaluations of the same tasks."""

    tasks_up: int
    tasks_down: int
    sign_test_p: float  # one-sided: the chance of at least tasks_up rising if nothing changed

    def to_dict(self) -> dict[str, float]:
        return {"tasks_up": float(self.tasks_up), "tasks_down": float(self.tasks_down),
                "sign_test_p": self.sign_test_p}


def paired_change(before: Mapping[str, float], after: Mapping[str, float]) -> PairedChange:
    """The per-task change from ``before`` to ``after`` (task id -> rate); both must hold the same tasks."""
    if set(before) != set(after):
        missing = sorted(set(before) ^ set(after))[:5]
        raise ValueError(f"the two evaluations cover different tasks (e.g. {missing}): a paired change needs both")
    up = sum(after[task] > rate for task, rate in before.items())
    down = sum(after[task] < rate for task, rate in before.items())
    return PairedChange(up, down, sign_test(up, down))


def task_rates(trials: TaskTrials) -> dict[str, float]:
    """Each task's pass fraction."""
    return {task: (sum(map(bool, results)) / len(results) if results else 0.0) for task, results in trials.items()}


def seed_spread(values: Sequence[float]) -> dict[str, float]:
    """The mean of one measure over seeds (or any repeats) and its spread: min, max and how many."""
    if not values:
        raise ValueError("no values to summarise")
    return {"mean": statistics.fmean(values), "min": min(values), "max": max(values), "n": float(len(values))}
