"""Group samplers on simulated prompts: how many training groups carry signal per rollout spent.

Each prompt has a pass rate ``p``; a rollout of it is resolved (+1) with probability ``p``, else
-1, with a random length. :func:`simulate` feeds a stream of such prompts to a group sampler
(:mod:`orchard.train.bar`) until a rollout budget is spent, which is how BAR, fixed-N GRPO and
dynamic filtering compare at equal cost without a model or sandboxes. The RL benchmark and the
BAR ablation notebook both use it.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Any

import numpy as np

from orchard.train.bar import GroupResult, GroupSampler


@dataclass
class SimulatedRollout:
    reward: float
    status: str
    length: int


def pass_rate_distributions(prompts: int, seed: int = 0) -> dict[str, np.ndarray]:
    """Per-prompt pass rates of three kinds of task set:

    - ``hard``: most prompts rarely solved, as for SWE tasks early in RL (Beta(0.5, 3));
    - ``uniform``: pass rates spread evenly over [0, 1];
    - ``polarised``: most prompts always or never solved (Beta(0.2, 0.2)), where fixed groups
      waste the most.
    """
    rng = np.random.default_rng(seed)
    return {"hard": rng.beta(0.5, 3.0, prompts), "uniform": rng.uniform(0.0, 1.0, prompts),
            "polarised": rng.beta(0.2, 0.2, prompts)}


def _run_to_completion(coroutine: Any) -> None:
    """Drive a coroutine that never suspends (the simulated rollouts are immediate) without an event
    loop, so simulations also run inside one (a notebook's)."""
    try:
        coroutine.send(None)
    except StopIteration:
        return
    coroutine.close()
    raise RuntimeError("a simulated group sampler suspended: it must only await the simulated rollouts")


def simulate(sampler: GroupSampler, pass_rates: np.ndarray, budget: int, seed: int = 0) -> dict[str, float]:
    """Spend ``budget`` rollouts on prompts drawn in order from ``pass_rates`` (cycling).

    Returns training groups produced (``updates``: non-empty groups), the fraction of them with
    reward variance (``informative_fraction``), informative groups per 100 rollouts, rollouts spent
    per training group, and how often each fallback fired.
    """
    rng = np.random.default_rng(seed)
    results: list[GroupResult] = []
    spent, index = 0, 0

    async def run() -> None:
        nonlocal spent, index
        while spent < budget:
            rate = float(pass_rates[index % len(pass_rates)])
            index += 1

            async def generate(k: int, rate: float = rate) -> list[SimulatedRollout]:
                solved = rng.random(k) < rate
                lengths = rng.integers(100, 1000, k)
                statuses = np.where(rng.random(k) < 0.1, "truncated", "completed")
                return [SimulatedRollout(1.0 if s else -1.0, str(st), int(n))
                        for s, st, n in zip(solved, statuses, lengths, strict=True)]

            result = await sampler.sample(generate)
            spent += result.spent
            results.append(result)

    _run_to_completion(run())
    trained = [r for r in results if r.group]
    informative = sum(r.informative for r in trained)
    return {"rollouts": float(spent), "prompts": float(len(results)), "updates": float(len(trained)),
            "informative_fraction": informative / len(trained) if trained else 0.0,
            "informative_per_100_rollouts": 100.0 * informative / max(spent, 1),
            "rollouts_per_update": spent / len(trained) if trained else float("inf"),
            "positive_fraction": statistics.fmean(statistics.fmean(x.reward > 0 for x in r.group) for r in trained)
            if trained else 0.0,
            "fallback_relaxed": float(sum(r.fallback == "relaxed" for r in results)),
            "fallback_top_ranked": float(sum(r.fallback == "top_ranked" for r in results))}
