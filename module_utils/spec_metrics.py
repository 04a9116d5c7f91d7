"""vLLM's spec-decode counters on /metrics, read into the figures of a window between two scrapes
(standard library only; used on the box by the smoke test and the speculation tuner).

Counters (prometheus_client, labels model_name and engine; the per-position one adds position) are
summed over engines. Over a window: acceptance rate = accepted / draft tokens, mean acceptance length
= 1 + accepted / drafts, per-position acceptance[i] = accepted at position i / drafts.
"""

from __future__ import annotations

from ansible.module_utils.prometheus_text import PrometheusParseError, format_series, parse, series_key
from ansible.module_utils.vllm_api import get_text

__all__ = [
    "SpecMetricsError",
    "spec_series",
    "created_series",
    "check_no_restart",
    "window_metrics",
    "per_request_counts",
    "scrape",
]

DRAFTS = "vllm:spec_decode_num_drafts_total"
DRAFT_TOKENS = "vllm:spec_decode_num_draft_tokens_total"
ACCEPTED = "vllm:spec_decode_num_accepted_tokens_total"
ACCEPTED_PER_POS = "vllm:spec_decode_num_accepted_tokens_per_pos_total"
SPEC_COUNTERS = (DRAFTS, DRAFT_TOKENS, ACCEPTED, ACCEPTED_PER_POS)
MODEL_LABEL = "model_name"
POSITION_LABEL = "position"


class SpecMetricsError(Exception):
    """The window cannot be measured; str() is the one-line reason."""


def _model_selector(samples, model, url):
    """Predicate over spec-decode samples: the model's series, or all of them without a model_name label."""
    spec = [sample for sample in samples if sample.name in SPEC_COUNTERS]
    if not any(sample.name == DRAFTS for sample in spec):
        raise SpecMetricsError(f"speculative decoding is not enabled on {url}: /metrics has no {DRAFTS}")
    names = sorted({sample.labels[MODEL_LABEL] for sample in spec if MODEL_LABEL in sample.labels})
    if names and model is not None and model not in names:
        raise SpecMetricsError(
            f"{url}/metrics has spec-decode counters for model_name {', '.join(names)} but none for {model}"
        )
    return lambda sample: model is None or sample.labels.get(MODEL_LABEL, model) == model


def spec_series(samples, model=None, url="the server"):
    """{series_key: value} of the spec-decode counters of `model`; SpecMetricsError when there are none.

    `samples` come from prometheus_text.parse(); `model=None` takes every model_name.
    """
    keep = _model_selector(samples, model, url)
    return {series_key(s): s.value for s in samples if s.name in SPEC_COUNTERS and keep(s)}


def created_series(samples, model=None):
    """{series_key of the counter: creation time} from the `_created` gauges of the spec-decode counters."""
    created = {}
    for counter in SPEC_COUNTERS:
        gauge = counter[: -len("_total")] + "_created"
        for sample in samples:
            if sample.name == gauge and (model is None or sample.labels.get(MODEL_LABEL, model) == model):
                created[(counter, tuple(sorted(sample.labels.items())))] = sample.value
    return created


def _show(key, value):
    return f"{format_series(key[0], dict(key[1]))} {value:g}"


def check_no_restart(before, after, created_before=None, created_after=None):
    """Raise SpecMetricsError when a counter went down, or a counter was re-created, between two scrapes.

    `before`/`after` are spec_series() results; a series missing from a scrape counts as 0 there.
    """
    backwards = []
    for key in sorted(set(before) | set(after)):
        old, new = before.get(key, 0.0), after.get(key, 0.0)
        if new < old:
            backwards.append(f"{_show(key, old)} -> {new:g}")
    if backwards:
        more = f" (and {len(backwards) - 1} more)" if len(backwards) > 1 else ""
        raise SpecMetricsError(
            f"spec-decode counters went backwards between scrapes (server restarted?): {backwards[0]}{more}"
        )
    created_before, created_after = created_before or {}, created_after or {}
    recreated = [
        key
        for key in sorted(created_before)
        if key in created_after and created_after[key] != created_before[key]
    ]
    if recreated:
        key = recreated[0]
        gauge = key[0][: -len("_total")] + "_created"
        raise SpecMetricsError(
            "spec-decode counters were re-created between scrapes (server restarted?): "
            f"{format_series(gauge, dict(key[1]))} {created_before[key]:.3f} -> {created_after[key]:.3f}"
        )


def _total(series, name):
    return sum(value for key, value in series.items() if key[0] == name)


def _per_position(series):
    positions = {}
    for (name, labels), value in series.items():
        labels = dict(labels)
        if name == ACCEPTED_PER_POS and POSITION_LABEL in labels:
            try:
                position = int(labels[POSITION_LABEL])
            except ValueError:
                raise SpecMetricsError(
                    f"{ACCEPTED_PER_POS} has a non-numeric position {labels[POSITION_LABEL]!r}"
                ) from None
            positions[position] = positions.get(position, 0.0) + value
    return positions


def _count(value):
    return int(value) if float(value).is_integer() else value


def window_metrics(before, after):
    """Spec-decode figures of the window between two spec_series() results (counters summed over engines).

    Checks for a restart first (check_no_restart without the _created gauges; main() adds those).
    """
    check_no_restart(before, after)
    drafts = _total(after, DRAFTS) - _total(before, DRAFTS)
    draft_tokens = _total(after, DRAFT_TOKENS) - _total(before, DRAFT_TOKENS)
    accepted = _total(after, ACCEPTED) - _total(before, ACCEPTED)
    pos_before, pos_after = _per_position(before), _per_position(after)
    positions = range(max(set(pos_before) | set(pos_after), default=-1) + 1)
    per_pos = [_count(pos_after.get(i, 0.0) - pos_before.get(i, 0.0)) for i in positions]
    return {
        "num_drafts": _count(drafts),
        "num_draft_tokens": _count(draft_tokens),
        "num_accepted_tokens": _count(accepted),
        "num_accepted_tokens_per_pos": per_pos,
        "acceptance_rate": accepted / draft_tokens if draft_tokens > 0 else None,
        "mean_acceptance_length": 1 + accepted / drafts if drafts > 0 else None,
        "per_position_acceptance": [count / drafts for count in per_pos] if drafts > 0 else [],
    }


def per_request_counts(snapshots):
    """[drafts, accepted, draft tokens] of each request from the spec_series() read before the first and
    after each."""
    return [
        [_count(_total(after, name) - _total(before, name)) for name in (DRAFTS, ACCEPTED, DRAFT_TOKENS)]
        for before, after in zip(snapshots, snapshots[1:])
    ]


def scrape(base_url, api_key, timeout):
    url = base_url + "/metrics"
    _status, text = get_text(url, api_key=api_key, timeout=timeout)
    try:
        return parse(text)
    except PrometheusParseError as exc:
        raise SpecMetricsError(f"cannot parse {url}: {exc}") from None
