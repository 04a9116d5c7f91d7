"""module_utils/spec_stats.py: the intervals say what they claim (coverage measured by simulation) and the
verdict is three-way. Simulations draw from known distributions with a fixed seed."""

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


def clustered(rng, requests=16, drafts=20):
    """Per-request [drafts, accepted, draft tokens] of requests whose drafter fit differs (a prompt that
    suits the drafter suits it all the way), as each response reports them (vLLM's per-request figures)
    whatever the concurrency they were sent at."""
    per_request = []
    for _ in range(requests):
        p = rng.choice([0.3, 0.9])
        per_request.append((drafts, sum(draft_counts(rng, drafts, [p, p, p])), 3 * drafts))
    return per_request


def window_of(per_request, k=3):
    drafts = sum(d for d, _a, _t in per_request)
    accepted = sum(a for _d, a, _t in per_request)
    # The per-position split does not enter the mean length or the rate; any prefix-rule split will do.
    positions = [max(0, min(drafts, accepted - i * drafts)) for i in range(k)]
    return {
        "num_drafts": drafts,
        "num_draft_tokens": sum(t for _d, _a, t in per_request),
        "num_accepted_tokens": accepted,
        "num_accepted_tokens_per_pos": positions,
    }


TRUTH = 1 + sum((0.3**i + 0.9**i) / 2 for i in (1, 2, 3))


def per_request_interval(per_request):
    return spec_stats.intervals(window_of(per_request), 0.95, per_request)["mean_acceptance_length"]


@pytest.mark.parametrize("requests", [8, 16, 32])
def test_the_spread_over_requests_covers_what_it_claims(requests):
    """Requests that differ, at concurrency 4 as at 1: each response's own counts give the interval, and it
    covers the truth at least 93% of the time over redrawn workloads."""
    cover = coverage(lambda rng: clustered(rng, requests), TRUTH, per_request_interval, 1000)
    assert 0.93 <= cover <= 0.98, cover


def test_drafts_taken_as_independent_would_claim_far_more_than_there_is():
    """Why no interval comes from the drafts alone: the Wilson interval of the window's draft tokens
    (what a gate without per-request counts has) covers the same truth far less often."""
    rate_truth = (TRUTH - 1) / 3

    def over_drafts(per_request):
        window = window_of(per_request)
        return spec_stats.wilson(window["num_accepted_tokens"], window["num_draft_tokens"], Z95)

    assert coverage(clustered, rate_truth, over_drafts, 1000) < 0.6


def test_too_few_requests_or_none_give_no_interval():
    four = [(20, 30, 60)] * 4
    result = spec_stats.intervals(window_of(four), 0.95, four)
    assert (result["method"], result["requests"], result["mean_acceptance_length"]) == (None, 4, None)
    assert result["acceptance_rate"] is None
    assert spec_stats.intervals(window_of(four), 0.95, [])["requests"] == 0
    # Requests that drafted nothing (a one-token answer) do not count.
    assert spec_stats.intervals(window_of(four), 0.95, four + [(0, 0, 0)])["requests"] == 4


def test_intervals_of_a_window():
    per_request = [(29, 36, 87), (29, 36, 87), (28, 33, 84), (30, 40, 90), (29, 35, 87), (29, 36, 87)]
    window = {**window_of(per_request), "num_accepted_tokens_per_pos": [120, 60, 36]}
    result = spec_stats.intervals(window, 0.95, per_request)
    low, high = result["mean_acceptance_length"]
    mean = 1 + 216 / 174
    assert low < mean < high and high - low < 0.2
    assert (result["method"], result["requests"]) == ("per request", 6)
    rate_low, rate_high = result["acceptance_rate"]
    assert rate_low < 216 / 522 < rate_high
    # Every request drafted k tokens a draft: the rate is the mean length's interval, rescaled.
    assert (rate_low, rate_high) == pytest.approx([(low - 1) / 3, (high - 1) / 3])
    assert result["per_position_acceptance"][0] == list(spec_stats.wilson(120, 174, Z95))
    # Requests that all walk alike have no spread: the interval is the point.
    same = [(29, 36, 87)] * 6
    assert (
        spec_stats.intervals(window_of(same), 0.95, same)["mean_acceptance_length"]
        == [pytest.approx(1 + 36 / 29)] * 2
    )
    assert spec_stats.intervals({**window, "num_drafts": 0, "num_accepted_tokens_per_pos": []}, 0.95) is None


@pytest.mark.parametrize(
    ("value", "interval", "text"),
    [
        (3.3684210526315788, [3.3684210526315788, 3.3684210526315788], "3.37 [3.37, 3.37]"),
        (3.3684210526315788, [3.21, 3.52], "3.37 [3.21, 3.52]"),
        (2.184, [2.1806, 2.1874], "2.184 [2.181, 2.187]"),
        (2.18412, [2.18411, 2.18413], "2.1841 [2.1841, 2.1841]"),
        (0.7894736842105263, None, "0.79"),
    ],
)
def test_a_figure_is_shown_with_the_digits_its_interval_supports(value, interval, text):
    assert spec_stats.shown(value, interval) == text


@pytest.mark.parametrize(
    ("interval", "expected"),
    [((2.25, 2.4), "above"), ((2.2, 2.4), "above"), ((2.05, 2.19), "below"), ((2.1, 2.3), "straddles")],
)
def test_verdict(interval, expected):
    assert spec_stats.verdict(interval, 2.2) == expected
