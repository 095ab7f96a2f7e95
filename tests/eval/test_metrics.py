"""pass@k, pass^k, avg@k, the resolve rate and the paired sign test against hand-computed values."""

from __future__ import annotations

import itertools
import math

import pytest

from orchard.eval.metrics import (
    avg_at_k,
    mean_pass_at_k,
    mean_pass_hat_k,
    paired_change,
    pass_at_k,
    pass_hat_k,
    resolve_rate,
    sign_test,
    task_rates,
)


def test_pass_at_k_is_the_unbiased_estimator():
    # n = 5, c = 2, k = 3: 1 - C(3, 3) / C(5, 3) = 1 - 1/10
    assert pass_at_k(5, 2, 3) == pytest.approx(0.9)
    # n = 10, c = 3, k = 1 is c / n; k = 2: 1 - C(7, 2) / C(10, 2) = 1 - 21/45
    assert pass_at_k(10, 3, 1) == pytest.approx(0.3)
    assert pass_at_k(10, 3, 2) == pytest.approx(24 / 45)
    assert pass_at_k(4, 0, 2) == 0.0 and pass_at_k(4, 4, 2) == 1.0  # c = 0 and c = n
    assert pass_at_k(4, 3, 2) == 1.0  # fewer than k failures: every draw of k holds a pass


def test_pass_hat_k_is_all_k_of_k_trials_passing():
    # n = 3, c = 2, k = 3: C(2, 3) / C(3, 3) = 0 (Claw-Eval's (c / n) ** k would say 0.296)
    assert pass_hat_k(3, 2, 3) == 0.0
    assert pass_hat_k(3, 2, 3) != pytest.approx((2 / 3) ** 3)
    # n = 5, c = 4, k = 3: C(4, 3) / C(5, 3) = 4/10
    assert pass_hat_k(5, 4, 3) == pytest.approx(0.4)
    assert pass_hat_k(8, 8, 3) == 1.0 and pass_hat_k(8, 0, 3) == 0.0 and pass_hat_k(6, 3, 1) == 0.5


def test_both_estimators_equal_brute_force_enumeration_of_every_draw():
    """Over every way to draw k of the n trials (the order of passes among them does not matter)."""
    for n in range(1, 7):
        for c in range(n + 1):
            trials = [True] * c + [False] * (n - c)
            for k in range(1, n + 1):
                draws = list(itertools.combinations(trials, k))
                assert pass_at_k(n, c, k) == pytest.approx(sum(any(d) for d in draws) / len(draws))
                assert pass_hat_k(n, c, k) == pytest.approx(sum(all(d) for d in draws) / len(draws))


@pytest.mark.parametrize("metric", [pass_at_k, pass_hat_k])
def test_bad_counts_are_clear_errors(metric):
    with pytest.raises(ValueError, match="at least 3 trials"):
        metric(2, 1, 3)  # n < k: there are not k trials to draw
    with pytest.raises(ValueError, match="0 <= c <= n"):
        metric(3, 4, 1)
    with pytest.raises(ValueError, match="k must be at least 1"):
        metric(3, 1, 0)


def test_averages_over_tasks():
    trials = {"a": [True, False, False, False], "b": [True, True, True, True], "c": [False] * 4}
    assert resolve_rate(r for t in trials.values() for r in t) == 5 / 12
    assert avg_at_k(trials) == pytest.approx((0.25 + 1.0 + 0.0) / 3)
    assert mean_pass_at_k(trials, 2) == pytest.approx((pass_at_k(4, 1, 2) + 1.0 + 0.0) / 3)  # (0.5 + 1 + 0) / 3
    assert mean_pass_hat_k(trials, 2) == pytest.approx((0.0 + 1.0 + 0.0) / 3)
    assert task_rates(trials) == {"a": 0.25, "b": 1.0, "c": 0.0}
    assert resolve_rate([]) == 0.0
    with pytest.raises(ValueError, match="no tasks"):
        mean_pass_at_k({}, 1)


def test_the_paired_change_and_its_sign_test():
    before, after = {"a": 0.25, "b": 1.0, "c": 0.0, "d": 0.5}, {"a": 0.5, "b": 0.75, "c": 0.0, "d": 0.75}
    change = paired_change(before, after)  # a and d rose, b fell, c did not change
    assert (change.tasks_up, change.tasks_down) == (2, 1)
    assert change.sign_test_p == pytest.approx(4 / 8)  # P(at least 2 of 3 flips up)
    assert sign_test(7, 0) == 1 / 2**7 and sign_test(0, 0) == 1.0
    assert sign_test(15, 5) == pytest.approx(sum(math.comb(20, i) for i in range(15, 21)) / 2**20)
    with pytest.raises(ValueError, match="different tasks"):
        paired_change(before, {"a": 1.0})
    with pytest.raises(ValueError, match="must not be negative"):
        sign_test(-1, 2)


def test_seed_spread_reports_mean_min_max_and_count():
    from orchard.eval.metrics import seed_spread

    assert seed_spread([0.25, 0.5, 0.0]) == {"mean": 0.25, "min": 0.0, "max": 0.5, "n": 3.0}
    with pytest.raises(ValueError, match="no values"):
        seed_spread([])
