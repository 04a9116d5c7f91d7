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
    "floor_alpha",
    "floor_at_k",
    "rate_floor_at_k",
    "floors_for_lengths",
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


def _geometric_sum(alpha, k):
    return sum(alpha**i for i in range(1, k + 1))


def floor_alpha(mean_length_floor, reference_k):
    """The per-position acceptance alpha that `mean_length_floor` at `reference_k` means, taken as
    decaying geometrically (position i accepted with probability alpha^(i+1)): 1 + sum of alpha^i for
    i = 1..reference_k is the floor. 2.2 at k=3 is alpha 0.607. Prometheus rules (roles/monitoring)
    carry alpha, so that a floor follows the k a box drafts."""
    if reference_k < 1:
        raise ValueError(f"k must be at least 1, got reference_k={reference_k}")
    if not 1 <= mean_length_floor <= 1 + reference_k:
        raise ValueError(f"a mean acceptance length floor at k={reference_k} lies in [1, {1 + reference_k}]")
    target = mean_length_floor - 1
    low, high = 0.0, 1.0
    for _ in range(60):  # bisection: the sum grows with alpha
        middle = (low + high) / 2
        low, high = (middle, high) if _geometric_sum(middle, reference_k) < target else (low, middle)
    return (low + high) / 2


def floor_at_k(mean_length_floor, reference_k, k):
    """The mean acceptance length floor for a draft of k tokens that means what `mean_length_floor`
    means at `reference_k`: the same drafter quality (floor_alpha). 2.2 at k=3 is 1.61 at k=1, 1.98 at
    k=2 and 2.34 at k=4."""
    if k < 1:
        raise ValueError(f"k must be at least 1, got reference_k={reference_k}, k={k}")
    return 1 + _geometric_sum(floor_alpha(mean_length_floor, reference_k), k)


def rate_floor_at_k(rate_floor, reference_k, k):
    """The acceptance-rate floor at k for `rate_floor` at `reference_k`, by the same model:
    (floor_at_k(1 + rate_floor * reference_k, reference_k, k) - 1) / k."""
    return (floor_at_k(1 + rate_floor * reference_k, reference_k, k) - 1) / k


def floors_for_lengths(mean_length_floor, rate_floor, reference_k, lengths):
    """(mean acceptance length floor, acceptance rate floor) for verify steps that drafted a mix of lengths
    ({draft length: steps}, as a k schedule drafts when the batch size moves): what each floor means at
    `reference_k` (floor_alpha), expected over the mix. A floor of None stays None; one length d gives
    floor_at_k and rate_floor_at_k at d."""
    steps = sum(lengths.values())
    mean = rate = None
    if mean_length_floor is not None:
        alpha = floor_alpha(mean_length_floor, reference_k)
        mean = 1 + sum(n * _geometric_sum(alpha, d) for d, n in lengths.items()) / steps
    if rate_floor is not None:
        alpha = floor_alpha(1 + rate_floor * reference_k, reference_k)
        drafted = sum(n * d for d, n in lengths.items())
        rate = sum(n * _geometric_sum(alpha, d) for d, n in lengths.items()) / drafted if drafted else None
    return mean, rate
