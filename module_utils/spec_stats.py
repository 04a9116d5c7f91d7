"""How sure a speculative-decoding measurement is: confidence intervals from vLLM's spec-decode counts,
and the gate's three-way verdict against a floor (standard library only; used on the box).

The workload is a sample of distinct requests, and at temperature 0 each request's outcome is fixed: the
only chance in a measurement is which requests were sent. So the interval comes from the spread over
requests - each request's own counts, read from its response (vLLM's per-request spec-decode metrics)
or from the counters read after it at concurrency 1: the ratio estimator sum(accepted) / sum(drafts),
linearised, with Student's t for the few requests. Drafts are never taken as independent: a prompt that
suits the drafter suits it all the way, and such an interval covers far less than it claims. Without
per-request counts, or with fewer than MIN_REQUESTS requests that drafted, there is no interval.
"""

from __future__ import annotations

import math
from statistics import NormalDist

__all__ = [
    "MIN_REQUESTS",
    "z_score",
    "t_score",
    "wilson",
    "ratio_interval",
    "intervals",
    "shown",
    "verdict",
]

# Fewer requests than this that drafted: the spread over so few says little, and no interval is given.
MIN_REQUESTS = 5


def z_score(confidence):
    """Two-sided normal quantile: 1.96 for 0.95."""
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must be between 0 and 1, got {confidence}")
    return NormalDist().inv_cdf(0.5 + confidence / 2)


def wilson(successes, trials, z):
    """Wilson score interval of a binomial proportion; (0, 1) without trials."""
    if trials <= 0:
        return 0.0, 1.0
    p = successes / trials
    centre = (p + z * z / (2 * trials)) / (1 + z * z / trials)
    half = z * math.sqrt(p * (1 - p) / trials + z * z / (4 * trials * trials)) / (1 + z * z / trials)
    return max(0.0, centre - half), min(1.0, centre + half)


def t_score(z, dof):
    """Student's t quantile for the normal quantile z and dof degrees of freedom (the Cornish-Fisher
    expansion to 1/dof^4, within 0.001 of the exact value from 4 degrees of freedom on at 95 %)."""
    return (
        z
        + (z**3 + z) / (4 * dof)
        + (5 * z**5 + 16 * z**3 + 3 * z) / (96 * dof**2)
        + (3 * z**7 + 19 * z**5 + 17 * z**3 - 15 * z) / (384 * dof**3)
        + (79 * z**9 + 776 * z**7 + 1482 * z**5 - 1920 * z**3 - 945 * z) / (92160 * dof**4)
    )


def ratio_interval(pairs, z):
    """(low, high) of sum(y) / sum(x) over [(x, y), ...] of the requests with x > 0 (the ratio estimator,
    linearised, Student's t); None with fewer than MIN_REQUESTS such requests."""
    requests = [(x, y) for x, y in pairs if x > 0]
    n = len(requests)
    if n < MIN_REQUESTS:
        return None
    total = sum(x for x, _ in requests)
    ratio = sum(y for _, y in requests) / total
    residuals = sum((y - ratio * x) ** 2 for x, y in requests)
    half = t_score(z, n - 1) * math.sqrt(n / (n - 1) * residuals) / total
    return ratio - half, ratio + half


def intervals(window, confidence, per_request=None):
    """Intervals of a spec_smoke window (num_drafts, num_draft_tokens, num_accepted_tokens and
    num_accepted_tokens_per_pos) from the per-request counts [(drafts, accepted, draft_tokens), ...] of
    distinct requests: {"confidence": c, "method": "per request" or None, "requests": requests that
    drafted, "mean_acceptance_length": [lo, hi] or None, "acceptance_rate": [lo, hi] or None,
    "per_position_acceptance": [[lo, hi], ...]}; None without drafts.

    The mean acceptance length and the acceptance rate (accepted over draft tokens) take the ratio
    estimator over requests; without per-request counts, or too few requests, they have none. Each
    position's acceptance is shown with a Wilson interval over drafts, which takes the drafts as
    independent: for reading, never for a verdict.
    """
    drafts = window["num_drafts"]
    positions = window["num_accepted_tokens_per_pos"]
    if not drafts or not positions:
        return None
    z = z_score(confidence)
    k = len(positions)
    counts = [tuple(request) for request in per_request or []]
    length = ratio_interval([(d, a) for d, a, _tokens in counts], z)
    rate = ratio_interval([(tokens, a) for _d, a, tokens in counts], z)
    return {
        "confidence": confidence,
        "method": "per request" if length else None,
        "requests": sum(1 for d, _a, _tokens in counts if d > 0),
        "mean_acceptance_length": [max(1.0, 1 + length[0]), min(1.0 + k, 1 + length[1])] if length else None,
        "acceptance_rate": [max(0.0, rate[0]), min(1.0, rate[1])] if rate else None,
        "per_position_acceptance": [list(wilson(count, drafts, z)) for count in positions],
    }


def shown(value, interval=None):
    """A figure with the digits its interval supports, and the interval: '3.37 [3.21, 3.52]'; 2 decimals
    (and no interval) without one, up to 4 for a narrow one."""
    if not interval:
        return f"{value:.2f}"
    half = (interval[1] - interval[0]) / 2
    digits = 2 if half <= 0 else min(4, max(2, -math.floor(math.log10(half))))
    return f"{value:.{digits}f} [{interval[0]:.{digits}f}, {interval[1]:.{digits}f}]"


def verdict(interval, floor):
    """ "above" when the whole interval clears the floor, "below" when it lies under it, else "straddles"."""
    low, high = interval
    if low >= floor:
        return "above"
    if high < floor:
        return "below"
    return "straddles"
