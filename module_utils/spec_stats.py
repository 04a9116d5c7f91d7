"""How sure a speculative-decoding measurement is: confidence intervals from vLLM's spec-decode counts,
and the gate's three-way verdict against a floor (standard library only; used on the box).

vLLM accepts a prefix of each draft: position i is accepted only when positions 0..i-1 were. So the
per-position counts c_0 >= c_1 >= ... of D drafts give the whole distribution of accepted tokens per draft
(exactly j accepted: c_{j-1} - c_j, with c_{-1} = D), and the mean acceptance length 1 + sum(c) / D is a
mean over drafts, whose spread those counts also give. Drafts of one request are not independent (a prompt
that suits the drafter suits it all the way), so where per-request counts exist the interval is also
computed over requests (a ratio estimator's variance), and the wider of the two is used.
"""

from __future__ import annotations

import math
from statistics import NormalDist

__all__ = [
    "z_score",
    "wilson",
    "per_draft_counts",
    "mean_length_interval",
    "intervals",
    "verdict",
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


def _se_over_requests(per_request):
    """Standard error of sum(accepted) / sum(drafts) over requests [(drafts, accepted), ...] (ratio
    estimator, linearised); None with fewer than two requests that drafted."""
    requests = [(d, a) for d, a in per_request if d > 0]
    if len(requests) < 2:
        return None
    total_drafts = sum(d for d, _ in requests)
    ratio = sum(a for _, a in requests) / total_drafts
    residuals = sum((a - ratio * d) ** 2 for d, a in requests)
    n = len(requests)
    return math.sqrt(n / (n - 1) * residuals) / total_drafts


def mean_length_interval(drafts, accepted_per_position, z, per_request=None):
    """((low, high), method) of the mean acceptance length 1 + sum(accepted) / drafts."""
    mean = 1 + sum(accepted_per_position) / drafts
    se = _se_over_drafts(drafts, accepted_per_position)
    method = "per draft"
    se_requests = _se_over_requests(per_request or [])
    if se_requests is not None:
        method = "per draft and per request, the wider"
        se = max(se, se_requests)
    k = len(accepted_per_position)
    return (max(1.0, mean - z * se), min(1.0 + k, mean + z * se)), method


def intervals(window, confidence, per_request=None):
    """Intervals of a spec_smoke window (num_drafts, num_draft_tokens, num_accepted_tokens and the raw
    per-position counts): {"mean_acceptance_length": [lo, hi], "acceptance_rate": [lo, hi],
    "per_position_acceptance": [[lo, hi], ...], "confidence": c, "method": ...}; None without drafts.

    Each position is a binomial over drafts (Wilson). The acceptance rate, when every draft proposed the
    same k tokens, is (mean acceptance length - 1) / k and takes that interval; otherwise Wilson over
    draft tokens (which takes the tokens of a draft as independent, so it is narrower than the truth).
    """
    drafts = window["num_drafts"]
    positions = window["accepted_per_position"]
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
