"""module_utils/spec_stats.py: the intervals say what they claim (coverage measured by simulation) and the
verdict is three-way. Simulations draw from known distributions with a fixed seed."""

import math

import numpy as np
import pytest
from ansible.module_utils import spec_stats

Z95 = spec_stats.z_score(0.95)


def test_z_score():
    assert pytest.approx(1.959964, abs=1e-6) == Z95
    assert spec_stats.z_score(0.9) == pytest.approx(1.644854, abs=1e-6)
    with pytest.raises(ValueError):
        spec_stats.z_score(1.0)


@pytest.mark.parametrize(("dof", "exact"), [(4, 2.776445), (7, 2.364624), (30, 2.042272)])
def test_t_score_is_students_quantile(dof, exact):
    assert spec_stats.t_score(Z95, dof) == pytest.approx(exact, abs=0.001)


def test_wilson_textbook_value():
    # Wilson (1927) / Newcombe (1998), example: 81 successes of 263 -> 0.2553 .. 0.3662 at 95 %.
    low, high = spec_stats.wilson(81, 263, Z95)
    assert (round(low, 4), round(high, 4)) == (0.2553, 0.3662)
    assert spec_stats.wilson(0, 0, Z95) == (0.0, 1.0)
    low, high = spec_stats.wilson(0, 124, Z95)
    assert low == 0.0 and 0 < high < 0.04


def test_per_draft_counts_follow_the_prefix_rule():
    # 10 drafts; 6 accepted position 0, 4 also position 1, 1 all three.
    assert spec_stats.per_draft_counts(10, [6, 4, 1]) == [4, 2, 3, 1]
    assert spec_stats.per_draft_counts(32, [32, 32, 32]) == [0, 0, 0, 32]


def coverage(draw, truth, interval, trials=2000):
    rng = np.random.default_rng(7)
    hits = 0
    for _ in range(trials):
        low, high = interval(draw(rng))
        hits += low <= truth <= high
    return hits / trials


def test_wilson_covers_95_percent():
    p, n = 0.26, 300
    cover = coverage(lambda rng: rng.binomial(n, p), p, lambda x: spec_stats.wilson(x, n, Z95))
    assert 0.93 <= cover <= 0.97, cover


def draft_counts(rng, drafts, per_position_p):
    """Per-position counts of drafts whose position i is accepted with probability p_i given i-1 was."""
    accepted = np.ones(drafts, dtype=bool)
    counts = []
    for p in per_position_p:
        accepted &= rng.random(drafts) < p
        counts.append(int(accepted.sum()))
    return counts


def test_mean_length_interval_covers_95_percent_for_independent_drafts():
    conditional = [0.62, 0.67, 0.5]  # per-position 0.62 / 0.41 / 0.21: a Kimi-like drafter
    truth = 1 + sum(math.prod(conditional[: i + 1]) for i in range(3))
    cover = coverage(
        lambda rng: draft_counts(rng, 232, conditional),
        truth,
        lambda counts: spec_stats.mean_length_interval(232, counts, Z95)[0],
    )
    assert 0.93 <= cover <= 0.97, cover


def clustered(rng, requests=16, drafts=20):
    """Requests whose drafter fit differs (a prompt that suits the drafter suits it all the way)."""
    per_request, totals = [], [0, 0, 0]
    for _ in range(requests):
        p = rng.choice([0.3, 0.9])
        counts = draft_counts(rng, drafts, [p, p, p])
        per_request.append((drafts, sum(counts)))
        totals = [a + b for a, b in zip(totals, counts)]
    return per_request, totals


def test_the_spread_over_requests_gives_honest_coverage_where_drafts_alone_do_not():
    truth = 1 + sum((0.3**i + 0.9**i) / 2 for i in (1, 2, 3))
    drafts = 16 * 20

    def per_draft(sample):
        return spec_stats.mean_length_interval(drafts, sample[1], Z95)[0]

    def both(sample):
        (low, high), method = spec_stats.mean_length_interval(drafts, sample[1], Z95, per_request=sample[0])
        assert method == "per request"
        return low, high

    naive, honest = coverage(clustered, truth, per_draft, 1000), coverage(clustered, truth, both, 1000)
    assert naive < 0.85, naive  # drafts taken as independent claim far more certainty than there is
    assert 0.90 <= honest <= 0.98, honest


def test_a_sample_without_spread_does_not_claim_certainty():
    (low, high), _ = spec_stats.mean_length_interval(16, [16, 16, 16], Z95)
    assert high == 4.0 and 3.4 < low < 4.0


def test_intervals_of_a_window():
    window = {"num_drafts": 232, "num_draft_tokens": 696, "num_accepted_tokens": 288}
    result = spec_stats.intervals({**window, "num_accepted_tokens_per_pos": [144, 96, 48]}, 0.95)
    low, high = result["mean_acceptance_length"]
    assert low < 1 + 288 / 232 < high
    assert result["acceptance_rate"] == [(low - 1) / 3, (high - 1) / 3]
    assert result["per_position_acceptance"][0] == list(spec_stats.wilson(144, 232, Z95))
    # Drafts of different lengths: the rate falls back to Wilson over draft tokens.
    uneven = spec_stats.intervals(
        {**window, "num_draft_tokens": 600, "num_accepted_tokens_per_pos": [144, 96, 48]}, 0.95
    )
    assert uneven["acceptance_rate"] == list(spec_stats.wilson(288, 600, Z95))
    assert spec_stats.intervals({**window, "num_drafts": 0, "num_accepted_tokens_per_pos": []}, 0.95) is None


@pytest.mark.parametrize(
    ("interval", "expected"),
    [((2.25, 2.4), "above"), ((2.2, 2.4), "above"), ((2.05, 2.19), "below"), ((2.1, 2.3), "straddles")],
)
def test_verdict(interval, expected):
    assert spec_stats.verdict(interval, 2.2) == expected
