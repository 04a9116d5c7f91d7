"""How sure a speculative-decoding measurement is: confidence intervals from vLLM's spec-decode counts,
and the gate's three-way verdict against a floor (standard library only; used on the box).

The workload is a sample of requests, and at temperature 0 each request's outcome is fixed: the only
chance in a measurement is which requests were sent. So where per-request counts exist (the smoke test
reads the counters after every request at concurrency 1), the interval comes from the spread over
requests: the ratio estimator sum(accepted) / sum(drafts), linearised, with Student's t for the few
requests. Without them (concurrent requests), drafts are taken as independent: vLLM accepts a prefix of
each draft (position i only when positions 0..i-1 were), so the per-position counts c_0 >= c_1 >= ... of
D drafts give the whole distribution of accepted tokens per draft (exactly j accepted: c_{j-1} - c_j, with
c_{-1} = D), and the mean acceptance length 1 + sum(c) / D is a mean over drafts with that spread.
"""

from __future__ import annotations

import math
from statistics import NormalDist

__all__ = [
    "z_score",
    "t_score",
    "wilson",
    "per_draft_counts",
    "mean_length_interval",
    "intervals",
    "verdict",
    "floor_alpha",
    "floor_at_k",
    "rate_floor_at_k",
]


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


def per_draft_counts(drafts, accepted_per_position):
    """Drafts with exactly 0, 1, ..., k accepted tokens, from the per-position counts (a prefix rule)."""
    counts = []
    above = drafts
    for accepted in accepted_per_position:
        counts.append(max(0, above - accepted))
        above = accepted
    counts.append(max(0, above))
    return counts


def _se_over_drafts(drafts, accepted_per_position):
    """Standard error of the mean accepted tokens per draft, drafts taken as independent. One pseudo-draft
    at each extreme (none and all accepted) enters the spread, not the mean, so that a sample with no
    spread at all (every draft accepted in full) does not claim certainty."""
    counts = per_draft_counts(drafts, accepted_per_position)
    k = len(counts) - 1
    mean = sum(j * n for j, n in enumerate(counts)) / drafts
    spread = sum((j - mean) ** 2 * n for j, n in enumerate(counts)) + mean**2 + (k - mean) ** 2
    return math.sqrt(spread / (drafts + 2) / drafts)


# Fewer requests than this that drafted: the spread over so few says little; drafts are used instead.
MIN_REQUESTS = 5


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


def _se_over_requests(per_request):
    """(standard error of sum(accepted) / sum(drafts), requests) over [(drafts, accepted), ...] (the ratio
    estimator, linearised); None with fewer than MIN_REQUESTS requests that drafted."""
    requests = [(d, a) for d, a in per_request if d > 0]
    if len(requests) < MIN_REQUESTS:
        return None
    total_drafts = sum(d for d, _ in requests)
    ratio = sum(a for _, a in requests) / total_drafts
    residuals = sum((a - ratio * d) ** 2 for d, a in requests)
    n = len(requests)
    return math.sqrt(n / (n - 1) * residuals) / total_drafts, n


def mean_length_interval(drafts, accepted_per_position, z, per_request=None):
    """((low, high), method) of the mean acceptance length 1 + sum(accepted) / drafts: over requests
    where at least MIN_REQUESTS per-request counts are given, else over drafts."""
    mean = 1 + sum(accepted_per_position) / drafts
    over_requests = _se_over_requests(per_request or [])
    if over_requests is not None:
        se, n = over_requests
        half, method = t_score(z, n - 1) * se, "per request"
    else:
        half, method = z * _se_over_drafts(drafts, accepted_per_position), "per draft"
    k = len(accepted_per_position)
    return (max(1.0, mean - half), min(1.0 + k, mean + half)), method


def intervals(window, confidence, per_request=None):
    """Intervals of a spec_smoke window (num_drafts, num_draft_tokens, num_accepted_tokens and
    num_accepted_tokens_per_pos): {"mean_acceptance_length": [lo, hi], "acceptance_rate": [lo, hi],
    "per_position_acceptance": [[lo, hi], ...], "confidence": c, "method": ...}; None without drafts.

    Each position is a binomial over drafts (Wilson). The acceptance rate, when every draft proposed the
    same k tokens, is (mean acceptance length - 1) / k and takes that interval; otherwise Wilson over
    draft tokens (which takes the tokens of a draft as independent, so it is narrower than the truth).
    """
    drafts = window["num_drafts"]
    positions = window["num_accepted_tokens_per_pos"]
    if not drafts or not positions:
        return None
    z = z_score(confidence)
    (low, high), method = mean_length_interval(drafts, positions, z, per_request)
    k = len(positions)
    if window["num_draft_tokens"] == k * drafts:
        rate = [(low - 1) / k, (high - 1) / k]
    else:
        rate = list(wilson(window["num_accepted_tokens"], window["num_draft_tokens"], z))
    return {
        "confidence": confidence,
        "method": method,
        "mean_acceptance_length": [low, high],
        "acceptance_rate": rate,
        "per_position_acceptance": [list(wilson(count, drafts, z)) for count in positions],
    }


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
