"""Scoring NCCL all-reduce measurements on a model's message sizes (standard library only, no AnsibleModule).

library/nccl_tune.py measures each candidate environment on the box and keeps the timings; what is here
turns those timings into a choice: size_profile() gives the all-reduce sizes a model sends, weighted by
phase (decode, prefill), and score() rates every candidate by its weighted geometric mean time relative to
NCCL's defaults and picks the winner. bench/nccl_tune_table.py prints the same figures for kept reports.
"""

import math

__all__ = [
    "BYTES_PER_ELEMENT",
    "DEFAULTS",
    "MeasurementError",
    "size_profile",
    "bus_bandwidth_gbps",
    "weighted_geomean_ratio",
    "score",
    "human_size",
    "ratio_text",
    "summary_lines",
]

BYTES_PER_ELEMENT = 2  # bf16 activations
DEFAULTS = "defaults"


class MeasurementError(Exception):
    """A measurement that cannot be used (here: NCCL's defaults were not measured at every size)."""


def size_profile(hidden_size, decode_batch_sizes, prefill_chunk_tokens, decode_weight, prefill_weight):
    """[(bytes, weight, label)]: the all-reduce sizes this model sends, weighted by phase."""
    phases = (
        ("decode", "batch", decode_batch_sizes, decode_weight),
        ("prefill", "tokens", prefill_chunk_tokens, prefill_weight),
    )
    weights = {}
    labels = {}
    for phase, unit, counts, phase_weight in phases:
        counts = sorted(set(counts))
        for count in counts:
            size = hidden_size * count * BYTES_PER_ELEMENT
            weights[size] = weights.get(size, 0.0) + phase_weight / len(counts)
            labels.setdefault(size, []).append(f"{phase} {unit} {count}")
    return [
        {"bytes": size, "weight": weights[size], "label": ", ".join(labels[size])} for size in sorted(weights)
    ]


def bus_bandwidth_gbps(size, seconds, world_size):
    """NCCL's bus bandwidth for all-reduce: algorithm bandwidth x 2(n-1)/n, in GB/s."""
    return size / seconds * 2 * (world_size - 1) / world_size / 1e9


def weighted_geomean_ratio(times, base, entries):
    total = sum(entry["weight"] for entry in entries)
    if not total:
        return None
    log_sum = sum(
        entry["weight"] * math.log(times[entry["bytes"]] / base[entry["bytes"]]) for entry in entries
    )
    return math.exp(log_sum / total)


def score(report, profile, min_gain):
    """Score every candidate of a measurement report on the profile and pick the winner."""
    world_size = report["world_size"]
    phases = {
        "decode": [entry for entry in profile if "decode" in entry["label"]],
        "prefill": [entry for entry in profile if "prefill" in entry["label"]],
    }
    sizes = [entry["bytes"] for entry in profile]
    measured = {}
    for candidate in report["candidates"]:
        times = {row["bytes"]: row["median_s"] for row in candidate.get("timings", [])}
        if "error" not in candidate and all(size in times for size in sizes):
            measured[candidate["name"]] = times
    if DEFAULTS not in measured:
        defaults = next((c for c in report["candidates"] if c["name"] == DEFAULTS), {})
        raise MeasurementError(
            f"NCCL's defaults could not be measured: {defaults.get('error', 'sizes missing')}"
        )
    base = measured[DEFAULTS]
    scored = []
    for candidate in report["candidates"]:
        entry = {"name": candidate["name"], "env": candidate["env"]}
        times = measured.get(candidate["name"])
        if times is None:
            entry["error"] = candidate.get("error", "not measured at every size of the profile")
        else:
            entry["score"] = round(weighted_geomean_ratio(times, base, profile), 4)
            for phase, entries in phases.items():
                ratio = weighted_geomean_ratio(times, base, entries)
                entry[f"{phase}_score"] = None if ratio is None else round(ratio, 4)
            entry["sizes"] = [
                {
                    "bytes": size,
                    "median_us": round(times[size] * 1e6, 2),
                    "busbw_gbps": round(bus_bandwidth_gbps(size, times[size], world_size), 2),
                }
                for size in sizes
            ]
        scored.append(entry)
    ranked = sorted((c for c in scored if "score" in c), key=lambda c: c["score"])
    best = ranked[0]
    if best["name"] != DEFAULTS and best["score"] <= 1 - min_gain:
        winner = best
        reason = (
            f"{best['name']}: {best['score']:.2f}x the defaults' time on the profile"
            f" (decode {ratio_text(best['decode_score'])}, prefill {ratio_text(best['prefill_score'])})"
        )
    else:
        winner = next(c for c in scored if c["name"] == DEFAULTS)
        runner_up = next((c for c in ranked if c["name"] != DEFAULTS), None)
        best_other = (
            f"best other: {runner_up['name']} {runner_up['score']:.2f}" if runner_up else "no other candidate"
        )
        reason = f"{DEFAULTS}: no candidate beat NCCL's defaults by {min_gain:.0%} ({best_other})"
    phase_winners = {}
    for phase in phases:
        contenders = [c for c in ranked if c.get(f"{phase}_score") is not None]
        if contenders:
            phase_winners[phase] = min(contenders, key=lambda c: c[f"{phase}_score"])["name"]
    choice = {
        "chosen": winner["name"],
        "env": winner["env"],
        "reason": reason,
        "candidates": scored,
        "phase_winners": phase_winners,
    }
    choice["summary"] = summary_lines(choice)
    return choice


def human_size(size):
    if size >= 1 << 20:
        return f"{size / (1 << 20):g}M"
    return f"{size / 1024:g}K" if size >= 1024 else f"{size}B"


def ratio_text(ratio):
    return "n/a" if ratio is None else f"{ratio:.2f}"


def summary_lines(choice):
    """One line per candidate: scores, then the median time per size (for the play's output)."""
    lines = []
    for candidate in choice["candidates"]:
        mark = "*" if candidate["name"] == choice["chosen"] else " "
        if "error" in candidate:
            lines.append(f"{mark} {candidate['name']}: {candidate['error']}")
            continue
        times = " ".join(
            f"{human_size(size['bytes'])}={size['median_us']:g}us" for size in candidate["sizes"]
        )
        decode, prefill = ratio_text(candidate["decode_score"]), ratio_text(candidate["prefill_score"])
        scores = f"score {candidate['score']:.2f} (decode {decode}, prefill {prefill})"
        lines.append(f"{mark} {candidate['name']}: {scores} {times}")
    return lines
