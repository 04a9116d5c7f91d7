"""Speculation settings chosen from a measured table (standard library only; used on the box by
spec_tune, and by the bench that prints its figures).

The table has one row per (k, concurrency): output tokens per second and inter-token latency with k
speculative tokens (k = 0: speculation off) at that many concurrent requests, each round's tokens per
second (round r sends the same requests at every k), and, for k > 0, the acceptance counted meanwhile.
A k's gain over speculation off is measured on paired rounds: the mean of log(speed at k / speed at 0)
over the rounds, with its Student's t interval; a k is shown to pay where the interval's low end is at
least 1 + `min_gain` (one round shows nothing); a larger k is taken over a smaller one only where its
gain over that one is shown the same way. Per concurrency, ascending, the k so chosen is never larger than
the one chosen below it (speculation pays less in larger batches: a k that comes back at a larger batch is
noise), else 0. A concurrency c_i measured stands for batch sizes c_i
up to the next one measured, less one; the last up to max_num_seqs. vLLM's schedule
(num_speculative_tokens_per_batch_size, vLLM >= 0.24) is that list of [start, end, k] ranges. Without
it one k serves every batch size: the one with the best weighted geometric mean of its speed over
speculation off on the inventory's concurrency profile, shown the same way.

Greedy drafting proposes the same first tokens whatever k is, so the per-position acceptance measured
at the largest k predicts the mean acceptance length of every smaller k: 1 + a_0 + ... + a_{k-1}.
"""

from __future__ import annotations

import math

from ansible.module_utils.spec_stats import t_score, z_score

__all__ = [
    "SCHEDULE_KEY",
    "ScheduleError",
    "predicted_mean_length",
    "gain_interval",
    "gains",
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


def gate_floor(floors):
    """A predicate over rows: True where the cell's measured mean acceptance length meets the gate's
    floor at the cell's k ({k: floor}, the box's served floors), so the tuner never chooses a k that the
    gate would then fail; None: no floor, all rows."""
    if not floors:
        return None

    def meets(row):
        length = row.get("mean_acceptance_length")
        k = int(row["k"])
        return k == 0 or length is None or length >= floors[k] - 1e-9

    return meets


def _speeds(rows, eligible=None):
    """{concurrency: {k: [tokens/s of each round]}} of the eligible rows (a row without rounds is one
    round); every concurrency needs k = 0."""
    speeds = {}
    for row in rows:
        if eligible is not None and not eligible(row):
            continue
        rounds = [float(speed) for speed in row.get("rounds_tokens_per_second") or [row["tokens_per_second"]]]
        speeds.setdefault(int(row["concurrency"]), {})[int(row["k"])] = rounds
    for concurrency, by_k in speeds.items():
        if not by_k.get(0) or min(by_k[0]) <= 0:
            raise ScheduleError(f"no speed without speculation at concurrency {concurrency}")
    return dict(sorted(speeds.items()))


def _log_ratios(off, on):
    """log(speed at k / speed off) of each round both measured (round r: the same requests)."""
    return [math.log(max(b, 1e-9) / a) for a, b in zip(off, on)]


def gain_interval(logs, confidence):
    """(gain, low, high): exp of the mean log ratio over the rounds and of its Student's t interval;
    one round gives no interval: (gain, 0.0, None)."""
    n = len(logs)
    mean = sum(logs) / n
    if n < 2:
        return math.exp(mean), 0.0, None
    spread = math.sqrt(sum((x - mean) ** 2 for x in logs) / (n - 1))
    half = t_score(z_score(confidence), n - 1) * spread / math.sqrt(n)
    return math.exp(mean), math.exp(mean - half), math.exp(mean + half)


def _rounded(interval):
    return [None if value is None else round(value, 4) for value in interval]


def gains(rows, confidence=0.95, eligible=None):
    """{concurrency: {k: [gain, low, high]}} of every eligible k > 0 over speculation off (gain_interval)."""
    return {
        concurrency: {
            k: _rounded(gain_interval(_log_ratios(by_k[0], rounds), confidence))
            for k, rounds in sorted(by_k.items())
            if k > 0
        }
        for concurrency, by_k in _speeds(rows, eligible).items()
    }


def _shown(interval, min_gain):
    return interval[1] >= 1 + min_gain - 1e-9


def _beats(off, best, min_gain, confidence):
    """Whether a k (its log ratios over speculation off, and over the k chosen so far or None) is shown to
    gain min_gain over speculation off and, where a k is chosen already, to be faster than it by as much."""
    if not _shown(gain_interval(off, confidence), min_gain):
        return False
    if best is None:
        return True
    point, low, _high = gain_interval(best, confidence)
    return point > 1 and _shown([point, low], min_gain)


def best_k_per_concurrency(rows, min_gain, eligible=None, confidence=0.95):
    """{concurrency: (k, gain over speculation off)}: ascending in concurrency, and in k from the smallest,
    a k is taken where its gain over speculation off is shown (the low end of its interval at least
    1 + min_gain) and, over a smaller k already taken, its gain over that one too; never a larger k than
    the one chosen at the concurrency below; else (0, 1.0)."""
    chosen, cap = {}, None
    for concurrency, by_k in _speeds(rows, eligible).items():
        best, gain = 0, 1.0
        for k in sorted(k for k in by_k if k > 0 and (cap is None or k <= cap)):
            over_best = _log_ratios(by_k[best], by_k[k]) if best else None
            if _beats(_log_ratios(by_k[0], by_k[k]), over_best, min_gain, confidence):
                best, gain = k, gain_interval(_log_ratios(by_k[0], by_k[k]), confidence)[0]
        chosen[concurrency] = (best, gain)
        cap = best
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


def single_k(rows, profile, min_gain, eligible=None, confidence=0.95):
    """(k, {k: score}, {k: [low, high]}) for one k at every batch size: the score is the weighted
    geometric mean, over the profile's concurrencies ({concurrency: weight}; {} weighs every measured one
    alike), of the speed over speculation off, taken round by round, with its interval over the rounds;
    from the smallest k, a k is taken where its score shows 1 + min_gain at its interval's low end and,
    over a smaller k taken already, its score over that one too; else k = 0."""
    speeds = _speeds(rows, eligible)
    weights = {int(c): float(w) for c, w in (profile or {}).items() if float(w) > 0} or dict.fromkeys(
        speeds, 1.0
    )
    missing = sorted(set(weights) - set(speeds))
    if missing:
        raise ScheduleError(f"concurrency profile names {missing[0]}, which was not measured")
    total = sum(weights.values())
    ks = sorted({k for by_k in speeds.values() for k in by_k})

    def weighted(low_k, k):
        """The profile's weighted log ratio of k over low_k, round by round."""
        ratios = {c: _log_ratios(speeds[c][low_k], speeds[c][k]) for c in weights}
        rounds = min(len(logs) for logs in ratios.values())
        return [sum(w * ratios[c][r] for c, w in weights.items()) / total for r in range(rounds)]

    measured = [k for k in ks if all(k in speeds[c] for c in weights)]
    scores, intervals, best = {}, {}, 0
    for k in measured:
        score, low, high = _rounded(gain_interval(weighted(0, k), confidence))
        scores[k], intervals[k] = score, [low, high]
        if k and _beats(weighted(0, k), weighted(best, k) if best else None, min_gain, confidence):
            best = k
    return best, scores, intervals


def choose(rows, output, max_num_seqs, min_gain, profile=None, eligible=None, confidence=0.95):
    """The speculation settings from the table: a dict with
    - speculation: False when no k is shown to pay at batch size 1 (then nothing else matters: the
      drafter costs more than it saves where it helps most);
    - num_speculative_tokens: the largest k used;
    - schedule: [[start, end, k], ...] when `output` is "schedule" and k differs between ranges, else None;
    - per_concurrency: {concurrency: {k, gain, gains: {k: [gain, low, high]} of every k measured}}; scores
      and intervals
      (single k only); reason: one line.
    Only the rows `eligible` accepts are candidates (gate_floor: those the gate would pass).
    """
    per_concurrency = best_k_per_concurrency(rows, min_gain, eligible, confidence)
    # Every k measured, the ones the gate would fail too: the table shows what each would have gained.
    measured = gains(rows, confidence)
    table = {
        c: {"k": k, "gain": round(gain, 4), "gains": measured[c]} for c, (k, gain) in per_concurrency.items()
    }
    shown_as = f"the low end of its {confidence:.0%} interval"
    if output == "schedule":
        ranges = schedule_ranges({c: k for c, (k, _gain) in per_concurrency.items()}, max_num_seqs)
        top = max(k for _start, _end, k in ranges)
        if ranges[0][2] == 0:
            return _off(table, f"no k gains {min_gain:.0%} at concurrency {min(table)} ({shown_as})")
        shown = ", ".join(f"{start}-{end}: k={k}" for start, end, k in ranges)
        return {
            "speculation": True,
            "num_speculative_tokens": top,
            "schedule": ranges if len(ranges) > 1 else None,
            "per_concurrency": table,
            "reason": f"schedule {shown} (batch size: k)",
        }
    k, scores, intervals = single_k(rows, profile, min_gain, eligible, confidence)
    if k == 0:
        off = _off(table, f"no k gains {min_gain:.0%} on the concurrency profile ({shown_as})")
        return dict(off, scores=scores, intervals=intervals)
    low, high = intervals[k]
    shown = f"[{low:.2f}, {high:.2f}]" if high is not None else "(one round: no interval)"
    return {
        "speculation": True,
        "num_speculative_tokens": k,
        "schedule": None,
        "per_concurrency": table,
        "scores": scores,
        "intervals": intervals,
        "reason": (
            f"k={k} at every batch size ({scores[k]:.2f}x {shown} speculation off on the concurrency profile)"
        ),
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
