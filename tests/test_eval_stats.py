"""pope.eval.stats: permutation test, Welch interval and Student t against hand counts and reference values."""

import math

import numpy as np
import pytest

from pope.eval.stats import (
    PermutationResult,
    midranks,
    permutation_test,
    rank_sum_test,
    student_t_cdf,
    student_t_quantile,
    welch_interval,
)


def test_exact_permutation_p_from_the_35_splits():
    # {1,2,3,4} vs {5,6,7}: difference of means = 7 - (7/12) * (sum of the 3-group), observed -3.5 (sum 18).
    # |difference| >= 3.5 only for 3-group sums >= 18 ({5,6,7}) or <= 6 ({1,2,3}): 2 of C(7, 3) = 35 splits.
    result = permutation_test([1, 2, 3, 4], [5, 6, 7])
    assert result == PermutationResult(2 / 35, 35, True)
    assert result.describe() == "exact, all 35 splits"
    assert permutation_test([5, 6, 7], [1, 2, 3, 4]).p_value == pytest.approx(2 / 35)  # two-sided: symmetric


def test_permutation_small_samples_and_ties():
    # 2 vs 2 seeds: the observed split and its mirror are always the most extreme: p >= 2/6
    assert permutation_test([0.0, 0.1], [5.0, 5.1]).p_value == pytest.approx(1 / 3)
    assert permutation_test([1.0, 1.0], [1.0, 1.0]).p_value == 1.0  # all ties: every split is as extreme
    assert permutation_test([0.3], [0.7]) == PermutationResult(1.0, 2, True)
    # values equal only up to float rounding still count as ties of the observed statistic
    assert permutation_test([0.1 + 0.2, 0.5], [0.3, 0.5]).p_value == 1.0
    with pytest.raises(ValueError, match="two non-empty samples"):
        permutation_test([], [1.0])


def test_rank_sum_test_uses_order_only_and_allows_never():
    assert midranks([30.0, 10.0, math.inf, 10.0, math.inf]) == [3.0, 1.5, 4.5, 1.5, 4.5]  # ties share their mean rank
    # no overlap, 3 against 2: the observed split and its mirror are the two most extreme of C(5, 3) = 10
    result = rank_sum_test([80e3, 90e3, 70e3], [165e3, 110e3])
    assert result == PermutationResult(2 / 10, 10, True)
    # only the order counts: any values in the same order give the same p
    assert rank_sum_test([1, 2, 3], [1e9, 4]).p_value == result.p_value
    # "never" ranks after every step: 3 lifted off vs 3 never in 3 + 3 seeds is the no-overlap 2 / C(6, 3)
    assert rank_sum_test([5e3, 9e3, 7e3], [math.inf] * 3).p_value == pytest.approx(2 / 20)
    assert rank_sum_test([math.inf, math.inf], [math.inf, math.inf]).p_value == 1.0  # all tied
    # against the hand count on ranks: {1,2,3,4} vs {5,6,7} is test_exact_permutation_p_from_the_35_splits
    assert rank_sum_test([10, 20, 30, 40], [50, 60, 70]).p_value == pytest.approx(2 / 35)
    with pytest.raises(ValueError, match="two non-empty samples"):
        rank_sum_test([], [1.0])


def test_monte_carlo_permutation_is_seeded_and_close_to_exact():
    rng = np.random.default_rng(1)
    a, b = list(rng.normal(0, 1, 10)), list(rng.normal(0.8, 1, 10))  # C(20, 10) = 184,756 splits > 20,000
    exact = permutation_test(a, b, max_exact=10**6)
    sampled = permutation_test(a, b)
    assert exact.exact and exact.splits == math.comb(20, 10)
    assert not sampled.exact and sampled.splits == 20_000 and sampled.describe() == "Monte-Carlo, 20,000 random splits"
    assert sampled == permutation_test(a, b)  # seeded: the same p every time
    assert permutation_test(a, b, seed=1).p_value != sampled.p_value
    # binomial standard error of a 20,000-split estimate of p ~ 0.12 is ~0.0023
    assert abs(sampled.p_value - exact.p_value) < 0.01


def test_student_t_matches_tables():
    # two-sided 95 % critical values (any t table): df 1, 2, 5, 10, 30, and the normal limit
    for df, value in [(1, 12.7062), (2, 4.3027), (5, 2.5706), (10, 2.2281), (30, 2.0423), (1e7, 1.9600)]:
        assert student_t_quantile(0.975, df) == pytest.approx(value, abs=1e-4)
    assert student_t_quantile(0.5, 3.3) == pytest.approx(0.0, abs=1e-12)
    assert student_t_cdf(1.5, 4.0) + student_t_cdf(-1.5, 4.0) == pytest.approx(1.0, abs=1e-14)
    assert student_t_cdf(1.0, 1.0) == pytest.approx(0.75, abs=1e-12)  # Cauchy: 1/2 + atan(1)/pi
    with pytest.raises(ValueError, match="degrees of freedom"):
        student_t_cdf(1.0, 0.0)
    with pytest.raises(ValueError, match="p must be in"):
        student_t_quantile(1.0, 3.0)


def test_welch_interval_by_hand():
    # {1,2,3,4} vs {5,6,7}: variances 5/3 and 1, se^2 = 5/12 + 1/3 = 3/4, Welch df = 0.5625 / (0.41667^2/3 +
    # 0.33333^2/2) = 4.9592; interval -3.5 -+ t(0.975, 4.9592) * sqrt(3/4) (scipy.stats.ttest_ind(equal_var=False))
    low, high, df = welch_interval([1, 2, 3, 4], [5, 6, 7])
    assert df == pytest.approx(4.959183673469389, rel=1e-12)
    assert low == pytest.approx(-5.731711481338788, abs=1e-9) and high == pytest.approx(-1.2682885186612123, abs=1e-9)
    assert welch_interval([1.0], [2.0, 3.0]) is None  # one seed: no variance, no interval
    assert welch_interval([1.0, 1.0], [2.0, 2.0]) is None


def test_paired_permutation_test_is_exact_over_sign_flips():
    from pope.eval.stats import paired_interval, paired_permutation_test

    # every difference positive: only the all-plus and all-minus patterns are as extreme
    result = paired_permutation_test([0.1, 0.2, 0.3, 0.4])
    assert result == PermutationResult(2 / 16, 16, True, "sign flips")
    assert result.describe() == "exact, all 16 sign flips"
    # one pair can never be significant; a zero difference is extreme under every pattern
    assert paired_permutation_test([0.5]).p_value == 1.0
    assert paired_permutation_test([0.0, 0.0]).p_value == 1.0
    # mixed signs: the share of the 8 sign patterns whose |sum| reaches the observed 0.4, listed by hand
    values = [0.3, -0.1, 0.2]
    import itertools

    sums = [
        abs(sum(v if s else -v for v, s in zip(values, signs))) for signs in itertools.product((True, False), repeat=3)
    ]
    assert paired_permutation_test(values).p_value == pytest.approx(sum(x >= 0.4 - 1e-12 for x in sums) / 8)
    # Monte-Carlo above max_exact: seeded, never below the exact p in expectation, close to it
    many = [0.1 * (i % 3 - 0.5) + 0.05 for i in range(14)]
    exact = paired_permutation_test(many).p_value
    estimate = paired_permutation_test(many, max_exact=100)
    assert not estimate.exact and estimate.splits == 20_000 and abs(estimate.p_value - exact) < 0.02
    with pytest.raises(ValueError, match="at least one paired difference"):
        paired_permutation_test([])
    # the paired t interval: mean ± t(0.975, n-1) * sd / sqrt(n)
    low, high, df = paired_interval([1.0, 2.0, 3.0])
    assert df == 2 and (low + high) / 2 == pytest.approx(2.0)
    assert (high - low) / 2 == pytest.approx(4.302652729911275 * 1.0 / 3**0.5, rel=1e-9)
    assert paired_interval([1.0]) is None and paired_interval([2.0, 2.0]) is None


def test_resampled_power_tops_each_sample_up_from_its_own_values():
    from pope.eval.stats import resampled_power

    # nothing added: the observed test is the only future (p = 2/35 here, so never below 0.05, always below 0.06)
    assert resampled_power([1, 2, 3, 4], [5, 6, 7], 4, 3) == 0.0
    assert resampled_power([1, 2, 3, 4], [5, 6, 7], 4, 3, alpha=0.06) == 1.0
    # separated samples: any added seeds keep them apart, so 6 + 6 seeds always reach p = 2/924 < 0.05
    assert resampled_power([1, 2, 3], [5, 6, 7], 6, 6, simulations=50) == 1.0
    # identical samples never separate, whatever their size
    assert resampled_power([1, 2, 3], [1, 2, 3], 8, 8, simulations=50) == 0.0
    # overlapping samples: power grows with the number of seeds, and the estimate is seeded
    a, b = [99.8, 99.9, 99.9, 43.4, 91.2], [27.1, 83.5, 9.8, 83.5]
    powers = [resampled_power(a, b, n, n, simulations=200) for n in (5, 8, 12)]
    assert powers[0] == 0.0 and 0.2 < powers[1] < powers[2] and powers[2] > 0.7
    assert resampled_power(a, b, 8, 8, simulations=200) == powers[1]
    with pytest.raises(ValueError, match="at least the seeds already run"):
        resampled_power(a, b, 4, 8)
    with pytest.raises(ValueError, match="non-empty"):
        resampled_power([], b, 3, 8)
