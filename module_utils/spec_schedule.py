"""Speculation settings chosen from a measured table (standard library only; used on the box by
spec_tune, and by the bench that prints its figures).

The table has one row per (k, concurrency): output tokens per second and inter-token latency with k
speculative tokens (k = 0: speculation off) at that many concurrent requests, and, for k > 0, the
acceptance counted meanwhile. Per concurrency the best k is the fastest, if it beats speculation off
by `min_gain` (a noise floor), else 0. A concurrency c_i measured stands for batch sizes c_i up to the
next one measured, less one; the last up to max_num_seqs. vLLM's schedule
(num_speculative_tokens_per_batch_size, vLLM >= 0.24) is that list of [start, end, k] ranges. Without
it one k serves every batch size: the one with the best weighted geometric mean of its speed over
speculation off on the inventory's concurrency profile.

Greedy drafting proposes the same first tokens whatever k is, so the per-position acceptance measured
at the largest k predicts the mean acceptance length of every smaller k: 1 + a_0 + ... + a_{k-1}.
"""

from __future__ import annotations

import math

from ansible.module_utils.spec_stats import floor_at_k

__all__ = [
    "SCHEDULE_KEY",
    "ScheduleError",
    "predicted_mean_length",
    "best_k_per_concurrency",
    "schedule_ranges",
    "k_for_batch",
    "single_k",
    "choose",
    "check_schedule",
    "gate_floor",
]

# The speculative-config key of vLLM's schedule (vLLM >= 0.24.0).
SCHEDULE_KEY = "num_speculative_tokens_per_batch_size"


class ScheduleError(ValueError):
    """A table or schedule that cannot be used; str() is the one-line reason."""


def predicted_mean_length(per_position, k):
    """Mean acceptance length at k from the per-position acceptance measured at a k at least as large."""
    if k > len(per_position):
        raise ScheduleError(f"per-position acceptance has {len(per_position)} positions, not {k}")
    return 1 + sum(per_position[:k])


def gate_floor(min_mean_length, reference_k):
    """A predicate over rows: True where the cell's measured mean acceptance length meets the gate's
    floor at the cell's k (so the tuner never chooses a k that the gate would then fail); None: all."""
    if not min_mean_length:
        return None

    def meets(row):
        length = row.get("mean_acceptance_length")
        k = int(row["k"])
        return k == 0 or length is None or length >= floor_at_k(min_mean_length, reference_k, k) - 1e-9

    return meets


def _speeds(rows, eligible=None):
    """{concurrency: {k: tokens_per_second}} of the eligible rows; every concurrency needs k = 0."""
    speeds = {}
    for row in rows:
        if eligible is not None and not eligible(row):
            continue
        speeds.setdefault(int(row["concurrency"]), {})[int(row["k"])] = float(row["tokens_per_second"])
    for concurrency, by_k in speeds.items():
        if by_k.get(0, 0) <= 0:
            raise ScheduleError(f"no speed without speculation at concurrency {concurrency}")
    return dict(sorted(speeds.items()))


def best_k_per_concurrency(rows, min_gain, eligible=None):
    """{concurrency: (k, speed over speculation off)}: the fastest eligible k; 0 unless it gains min_gain."""
    chosen = {}
    for concurrency, by_k in _speeds(rows, eligible).items():
        off = by_k[0]
        k, speed = max(((k, s) for k, s in by_k.items() if k > 0), key=lambda item: item[1], default=(0, off))
        chosen[concurrency] = (k, speed / off) if speed >= off * (1 + min_gain) else (0, 1.0)
    return chosen


def schedule_ranges(choices, max_num_seqs):
    """[[start, end, k], ...] from {concurrency: k}: contiguous from 1 to max_num_seqs, neighbours with
    the same k merged. The lowest concurrency measured stands for batch sizes from 1."""
    if not choices:
        raise ScheduleError("no concurrency measured")
    levels = sorted(choices)
    if levels[-1] > max_num_seqs:
        raise ScheduleError(f"concurrency {levels[-1]} measured is above max_num_seqs {max_num_seqs}")
    ranges = []
    for index, concurrency in enumerate(levels):
        start = 1 if index == 0 else concurrency
        end = levels[index + 1] - 1 if index + 1 < len(levels) else max_num_seqs
        k = choices[concurrency]
        if ranges and ranges[-1][2] == k:
            ranges[-1][1] = end
        else:
            ranges.append([start, end, k])
    return ranges


def k_for_batch(schedule, batch_size, default):
    """The k vLLM uses at `batch_size` under `schedule` (a gap carries the previous k, as vLLM does)."""
    k = default
    for start, end, value in sorted(schedule or []):
        if start > batch_size:
            break
        k = value
        if batch_size <= end:
            break
    return min(k, default)


def single_k(rows, profile, min_gain, eligible=None):
    """(k, {k: score}) for one k at every batch size: the score is the weighted geometric mean, over
    the profile's concurrencies ({concurrency: weight}; {} weighs every measured one alike), of the
    speed over speculation off; k = 0 unless the best scores 1 + min_gain."""
    speeds = _speeds(rows, eligible)
    weights = {int(c): float(w) for c, w in (profile or {}).items() if float(w) > 0} or dict.fromkeys(
        speeds, 1.0
    )
    missing = sorted(set(weights) - set(speeds))
    if missing:
        raise ScheduleError(f"concurrency profile names {missing[0]}, which was not measured")
    total = sum(weights.values())
    ks = sorted({k for by_k in speeds.values() for k in by_k})
    scores = {}
    for k in ks:
        if all(k in speeds[c] for c in weights):
            log_mean = sum(w * math.log(speeds[c][k] / speeds[c][0]) for c, w in weights.items()) / total
            scores[k] = round(math.exp(log_mean), 4)
    best = max((k for k in scores if k > 0), key=lambda k: scores[k], default=0)
    return (best if best and scores[best] >= 1 + min_gain else 0), scores


def choose(rows, output, max_num_seqs, min_gain, profile=None, eligible=None):
    """The speculation settings from the table: a dict with
    - speculation: False when no k pays at batch size 1 (then nothing else matters: the drafter
      costs more than it saves where it helps most);
    - num_speculative_tokens: the largest k used;
    - schedule: [[start, end, k], ...] when `output` is "schedule" and k differs between ranges, else None;
    - per_concurrency: {concurrency: {k, gain}}; scores (single k only); reason: one line.
    Only the rows `eligible` accepts are candidates (gate_floor: those the gate would pass).
    """
    per_concurrency = best_k_per_concurrency(rows, min_gain, eligible)
    table = {c: {"k": k, "gain": round(gain, 4)} for c, (k, gain) in per_concurrency.items()}
    if output == "schedule":
        ranges = schedule_ranges({c: k for c, (k, _gain) in per_concurrency.items()}, max_num_seqs)
        top = max(k for _start, _end, k in ranges)
        if ranges[0][2] == 0:
            return _off(table, f"speculation gains less than {min_gain:.0%} at concurrency {min(table)}")
        shown = ", ".join(f"{start}-{end}: k={k}" for start, end, k in ranges)
        return {
            "speculation": True,
            "num_speculative_tokens": top,
            "schedule": ranges if len(ranges) > 1 else None,
            "per_concurrency": table,
            "reason": f"schedule {shown} (batch size: k)",
        }
    k, scores = single_k(rows, profile, min_gain, eligible)
    if k == 0:
        return dict(_off(table, f"no k gains {min_gain:.0%} on the concurrency profile"), scores=scores)
    return {
        "speculation": True,
        "num_speculative_tokens": k,
        "schedule": None,
        "per_concurrency": table,
        "scores": scores,
        "reason": f"k={k} at every batch size ({scores[k]:.2f}x speculation off on the concurrency profile)",
    }


def _off(table, why):
    return {
        "speculation": False,
        "num_speculative_tokens": 0,
        "schedule": None,
        "per_concurrency": table,
        "reason": f"speculation off: {why}",
    }


def check_schedule(schedule, num_speculative_tokens):
    """Raise ScheduleError with one line unless vLLM takes `schedule` as meant: [start, end, k] entries,
    the first from batch size 1, sorted without overlap, each k from 0 to num_speculative_tokens (vLLM
    silently caps a larger k)."""
    if not isinstance(schedule, list) or not schedule:
        raise ScheduleError(
            "num_speculative_tokens_per_batch_size must be a non-empty list of [start, end, k]"
        )
    previous_end = 0
    for entry in schedule:
        if (
            not isinstance(entry, (list, tuple))
            or len(entry) != 3
            or not all(isinstance(v, int) for v in entry)
        ):
            raise ScheduleError(f"schedule entry {entry!r} is not [start, end, k] of integers")
        start, end, k = entry
        if start <= previous_end or start > end:
            raise ScheduleError(f"schedule entry {entry!r}: ranges must be sorted, non-empty and not overlap")
        if not 0 <= k <= num_speculative_tokens:
            raise ScheduleError(
                f"schedule entry {entry!r}: k must be 0 to num_speculative_tokens {num_speculative_tokens}"
                " (vLLM caps a larger k silently)"
            )
        previous_end = end
    if schedule[0][0] != 1:
        raise ScheduleError(
            f"the schedule starts at batch size {schedule[0][0]}: vLLM needs it to start at 1"
        )
