"""Small-sample statistics for seed sweeps (``pope report``), in pure Python: no SciPy needed.

* :func:`permutation_test` — two-sided test of equal means of two samples: exact over every split of the
  pooled values when there are at most ``max_exact`` splits, else a seeded Monte-Carlo estimate;
* :func:`rank_sum_test` — the same test on the pooled values' ranks (the exact Wilcoxon rank-sum test), for
  values with an open end such as "never lifted off" (``math.inf``);
* :func:`paired_permutation_test` — two-sided sign-flip test that paired differences (one per seed, the two
  settings run with the same seed) have mean zero: exact over every sign pattern, or a seeded Monte-Carlo estimate;
* :func:`welch_interval` — the Welch (unequal-variance) t interval for the difference of two means;
* :func:`paired_interval` — the paired t interval for the mean of paired differences;
* :func:`wilson_interval` — the Wilson score interval of a binomial proportion;
* :func:`fisher_exact` — Fisher's exact two-sided test of equal proportions in two samples (e.g. lift-off rates);
* :func:`holm_adjust` — Holm's step-down adjustment of a family of p-values (several settings tested at once);
* :func:`resampled_power` — how often more seeds, drawn like the ones already run, would bring the permutation
  test below α (planning a sweep, not a result);
* :func:`student_t_quantile` — the Student t quantile behind the Welch interval (any real df > 0).
"""

from __future__ import annotations

import itertools
import math
import random
import statistics
from dataclasses import dataclass

MAX_EXACT_SPLITS = 20_000
"""Above this many splits of the pooled sample, the permutation p-value is a Monte-Carlo estimate."""
MONTE_CARLO_SPLITS = 20_000
"""Random splits drawn for the Monte-Carlo permutation p-value (seeded: the same numbers every time)."""


def wilson_interval(successes: int, n: int, z: float = 1.959964) -> tuple[float, float]:
    """Wilson score interval of a binomial proportion (95 % for the default z); (0, 1) for n = 0."""
    if n == 0:
        return 0.0, 1.0
    p = successes / n
    denominator = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denominator
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denominator
    return max(0.0, centre - half), min(1.0, centre + half)


def fisher_exact(successes_a: int, n_a: int, successes_b: int, n_b: int) -> float:
    """Two-sided p of Fisher's exact test that two samples share one success proportion: the probability, with
    the margins fixed (hypergeometric), of every 2 x 2 table at most as likely as the observed one (the usual
    two-sided rule, with a 1e-7 relative tolerance for ties). ValueError for counts outside 0 <= successes <= n."""
    if not (0 <= successes_a <= n_a and 0 <= successes_b <= n_b):
        raise ValueError(f"fisher_exact: need 0 <= successes <= n, got {successes_a}/{n_a} and {successes_b}/{n_b}")
    successes, total = successes_a + successes_b, n_a + n_b

    def probability(x: int) -> float:  # x successes in sample a
        return math.comb(n_a, x) * math.comb(n_b, successes - x) / math.comb(total, successes)

    observed = probability(successes_a)
    tables = range(max(0, successes - n_b), min(successes, n_a) + 1)
    return min(1.0, sum(p for p in map(probability, tables) if p <= observed * (1 + 1e-7)))


def holm_adjust(p_values: list[float]) -> list[float]:
    """Holm's step-down adjusted p-values, in the input order: the i-th smallest of m p-values times (m − i + 1),
    made non-decreasing in that order and capped at 1. Rejecting every hypothesis whose adjusted p is below α
    keeps the chance of any false rejection in the family at most α, whatever the dependence between tests."""
    if any(not 0.0 <= p <= 1.0 for p in p_values):
        raise ValueError(f"p-values must lie in [0, 1], got {p_values}")
    order = sorted(range(len(p_values)), key=lambda i: p_values[i])
    adjusted = [0.0] * len(p_values)
    running = 0.0
    for rank, index in enumerate(order):
        running = max(running, min(1.0, (len(p_values) - rank) * p_values[index]))
        adjusted[index] = running
    return adjusted


def _incomplete_beta(a: float, b: float, x: float) -> float:
    """Regularised incomplete beta I_x(a, b) by its continued fraction (Lentz), accurate to ~1e-14."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    if x > (a + 1) / (a + b + 2):  # the fraction converges fast only below the mean: use the symmetry
        return 1.0 - _incomplete_beta(b, a, 1.0 - x)
    front = math.exp(math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x)) / a
    tiny = 1e-300
    c, d = 1.0, 1.0 - (a + b) * x / (a + 1)
    d = 1.0 / (d if abs(d) > tiny else tiny)
    result = d
    for m in range(1, 500):
        for numerator in (
            m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m)),
            -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1)),
        ):
            d = 1.0 + numerator * d
            d = 1.0 / (d if abs(d) > tiny else tiny)
            c = 1.0 + numerator / c
            c = c if abs(c) > tiny else tiny
            result *= c * d
        if abs(c * d - 1.0) < 1e-15:
            break
    return front * result


def student_t_cdf(t: float, df: float) -> float:
    """P(T <= t) for Student's t with ``df`` > 0 degrees of freedom."""
    if not df > 0:
        raise ValueError(f"degrees of freedom must be positive, got {df!r}")
    # P(|T| > |t|) = I_{df/(df+t^2)}(df/2, 1/2) = 1 - I_{t^2/(df+t^2)}(1/2, df/2); the second form keeps
    # its precision for small |t| (where df/(df+t^2) rounds to 1)
    if t * t < df:
        tail = 0.5 * (1.0 - _incomplete_beta(0.5, df / 2, t * t / (df + t * t)))
    else:
        tail = 0.5 * _incomplete_beta(df / 2, 0.5, df / (df + t * t))
    return 1.0 - tail if t > 0 else tail


def student_t_quantile(p: float, df: float) -> float:
    """The t with P(T <= t) = p (0 < p < 1), by bisection on :func:`student_t_cdf` to ~1e-12."""
    if not 0 < p < 1:
        raise ValueError(f"p must be in (0, 1), got {p!r}")
    low, high = -1.0, 1.0
    while student_t_cdf(low, df) > p:
        low *= 2
    while student_t_cdf(high, df) < p:
        high *= 2
    for _ in range(200):
        middle = (low + high) / 2
        if student_t_cdf(middle, df) < p:
            low = middle
        else:
            high = middle
        if high - low < 1e-12 * max(1.0, abs(middle)):
            break
    return (low + high) / 2


def welch_interval(a: list[float], b: list[float], confidence: float = 0.95) -> tuple[float, float, float] | None:
    """(low, high, df) of the Welch t interval for mean(a) − mean(b); None when either sample has fewer
    than two values or both have zero spread (no variance to build an interval from)."""
    if len(a) < 2 or len(b) < 2:
        return None
    se2_a, se2_b = statistics.variance(a) / len(a), statistics.variance(b) / len(b)
    se2 = se2_a + se2_b
    if se2 == 0:
        return None
    df = se2 * se2 / (se2_a * se2_a / (len(a) - 1) + se2_b * se2_b / (len(b) - 1))
    half = student_t_quantile(0.5 + confidence / 2, df) * math.sqrt(se2)
    difference = statistics.fmean(a) - statistics.fmean(b)
    return difference - half, difference + half, df


@dataclass(frozen=True)
class PermutationResult:
    p_value: float
    splits: int
    """Arrangements evaluated: all C(n1 + n2, n1) splits (or 2^n sign patterns of a paired test) when exact, else
    the Monte-Carlo sample size."""
    exact: bool
    unit: str = "splits"
    """What was permuted: "splits" of a pooled sample, or "sign flips" of paired differences."""

    def describe(self) -> str:
        return (
            f"exact, all {self.splits:,} {self.unit}"
            if self.exact
            else f"Monte-Carlo, {self.splits:,} random {self.unit}"
        )


def permutation_test(
    a: list[float],
    b: list[float],
    *,
    max_exact: int = MAX_EXACT_SPLITS,
    samples: int = MONTE_CARLO_SPLITS,
    seed: int = 0,
) -> PermutationResult:
    """Two-sided permutation test of equal means: the share of splits of the pooled values into groups of
    len(a) and len(b) whose |difference of means| is at least the observed one (the observed split
    included). Exact when C(n1 + n2, n1) <= ``max_exact``; else ``samples`` random splits (seeded) with
    p = (1 + hits) / (1 + samples), which never underestimates the exact p-value in expectation."""
    if not a or not b:
        raise ValueError(f"a permutation test needs two non-empty samples, got {len(a)} and {len(b)} values")
    pooled = [float(v) for v in (*a, *b)]
    n_a, total = len(a), sum(pooled)
    sizes = (n_a, len(pooled) - n_a)

    def difference(sum_a: float) -> float:
        return abs(sum_a / sizes[0] - (total - sum_a) / sizes[1])

    observed = difference(sum(pooled[:n_a]))
    threshold = observed - 1e-12 * max(1.0, abs(observed))  # ties (equal up to rounding) count as extreme
    n_splits = math.comb(len(pooled), n_a)
    if n_splits <= max_exact:
        hits = sum(
            difference(sum(pooled[i] for i in chosen)) >= threshold
            for chosen in itertools.combinations(range(len(pooled)), n_a)
        )
        return PermutationResult(hits / n_splits, n_splits, True)
    rng = random.Random(seed)
    hits = sum(difference(sum(rng.sample(pooled, n_a))) >= threshold for _ in range(samples))
    return PermutationResult((1 + hits) / (1 + samples), samples, False)


def midranks(values: list[float]) -> list[float]:
    """The rank of each value among all of them, 1 for the smallest; tied values (``math.inf`` included) share
    the mean of the ranks they span."""
    order = sorted(range(len(values)), key=lambda i: values[i])
    ranks = [0.0] * len(values)
    start = 0
    while start < len(order):
        end = start
        while end + 1 < len(order) and values[order[end + 1]] == values[order[start]]:
            end += 1
        for position in range(start, end + 1):
            ranks[order[position]] = (start + end) / 2 + 1
        start = end + 1
    return ranks


def rank_sum_test(a: list[float], b: list[float], **options) -> PermutationResult:
    """Two-sided exact Wilcoxon rank-sum (Mann-Whitney) test: :func:`permutation_test` on the midranks of the
    pooled values, so only their order counts and ``math.inf`` ("never") is allowed, tied with itself. With no
    overlap between the groups p is its smallest possible value, 2 / C(len(a) + len(b), len(a))."""
    ranks = midranks([float(v) for v in (*a, *b)])
    return permutation_test(ranks[: len(a)], ranks[len(a) :], **options)


def paired_interval(differences: list[float], confidence: float = 0.95) -> tuple[float, float, float] | None:
    """(low, high, df) of the paired t interval for the mean of ``differences``; None for fewer than two values or
    zero spread."""
    if len(differences) < 2:
        return None
    variance = statistics.variance(differences)
    if variance == 0:
        return None
    df = len(differences) - 1
    half = student_t_quantile(0.5 + confidence / 2, df) * math.sqrt(variance / len(differences))
    mean = statistics.fmean(differences)
    return mean - half, mean + half, df


def paired_permutation_test(
    differences: list[float], *, max_exact: int = MAX_EXACT_SPLITS, samples: int = MONTE_CARLO_SPLITS, seed: int = 0
) -> PermutationResult:
    """Two-sided sign-flip test that paired differences have mean zero: under the null each difference is as
    likely negated, so p is the share of the 2^n sign patterns whose |mean| is at least the observed one (the
    observed pattern included; ties count as extreme). Exact when 2^n <= ``max_exact``; else ``samples`` random
    patterns (seeded) with p = (1 + hits) / (1 + samples). With n pairs the smallest possible p is 2 / 2^n."""
    if not differences:
        raise ValueError("a paired permutation test needs at least one paired difference")
    values = [float(v) for v in differences]
    observed = abs(sum(values))
    threshold = observed - 1e-12 * max(1.0, observed)
    n_patterns = 2 ** len(values)
    if n_patterns <= max_exact:
        hits = sum(
            abs(sum(v if sign else -v for v, sign in zip(values, signs))) >= threshold
            for signs in itertools.product((True, False), repeat=len(values))
        )
        return PermutationResult(hits / n_patterns, n_patterns, True, "sign flips")
    rng = random.Random(seed)
    hits = sum(abs(sum(v if rng.random() < 0.5 else -v for v in values)) >= threshold for _ in range(samples))
    return PermutationResult((1 + hits) / (1 + samples), samples, False, "sign flips")


def resampled_power(
    a: list[float],
    b: list[float],
    n_a: int,
    n_b: int,
    *,
    alpha: float = 0.05,
    simulations: int = 400,
    test_samples: int = 2_000,
    seed: int = 0,
) -> float:
    """The share of ``simulations`` imagined sweeps in which :func:`permutation_test` of ``n_a`` seeds against
    ``n_b`` seeds gives p < ``alpha``: each keeps the observed values and tops each sample up to its size with
    values drawn, with replacement, from that sample itself (a bootstrap). It assumes future seeds look like the
    ones already run: with few seeds it only ever draws outcomes already seen, and it carries the observed
    difference forward as if it were the true one (optimistic after a lucky first sweep), so it is a planning
    estimate, not evidence. Each test is exact up to :data:`MAX_EXACT_SPLITS` splits, else ``test_samples``
    random splits. ValueError if a sample is empty or a size is below its sample's length."""
    if not a or not b:
        raise ValueError(f"resampled_power needs two non-empty samples, got {len(a)} and {len(b)} values")
    if n_a < len(a) or n_b < len(b):
        raise ValueError(f"sizes {n_a} and {n_b} must be at least the seeds already run ({len(a)} and {len(b)})")
    if not 0 < alpha < 1 or simulations < 1:
        raise ValueError(f"need 0 < alpha < 1 and simulations >= 1, got alpha={alpha!r}, simulations={simulations!r}")
    rng = random.Random(seed)
    reached = 0
    for _ in range(simulations):
        sample_a = [*a, *(rng.choice(a) for _ in range(n_a - len(a)))]
        sample_b = [*b, *(rng.choice(b) for _ in range(n_b - len(b)))]
        reached += permutation_test(sample_a, sample_b, samples=test_samples, seed=rng.randrange(2**31)).p_value < alpha
    return reached / simulations
