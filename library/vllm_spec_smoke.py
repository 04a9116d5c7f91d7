#!/usr/bin/python
"""Ansible module: smoke-test speculative decoding on a running vLLM server from its spec-decode counters."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: vllm_spec_smoke
short_description: Measure speculative-decoding acceptance and throughput on a running vLLM server
description:
  - Runs on the box against its own vLLM server (OpenAI-compatible API). It checks C(/health) once, scrapes
    C(/metrics), sends a fixed set of chat completions, scrapes C(/metrics) again, and computes the
    speculative-decoding figures of that window from the difference of vLLM's spec-decode counters, summed
    over engines (and over the C(model_name) label of the model, when the label is there).
  - It does not wait for a server that is still starting; run it once the server serves (roles/vllm_service's
    readiness check, its C(ready) entry point, waits for that).
  - C(acceptance_rate) = Δaccepted / Δdraft_tokens; C(mean_acceptance_length) = 1 + Δaccepted / Δdrafts;
    C(per_position_acceptance[i]) = Δaccepted_per_pos{position=i} / Δdrafts, the formulas of vLLM's own
    C(SpecDecoding metrics) log line. C(tokens_per_second) is the completion tokens reported by the
    responses (C(usage.completion_tokens)) over the wall time of the request phase.
  - Returns the figures as the C(vllm_spec_smoke) fact together with C(passed) and a one-line C(reason).
    When a threshold is given and missed, the task fails with that reason and the figures stay in the
    result (C(ansible_facts.vllm_spec_smoke)).
  - Measure on chat prompts at temperature 0 (the defaults). Random tokens with C(ignore_eos) loop and
    inflate acceptance, so the built-in prompts are ordinary chat requests.
  - The figures come with confidence intervals (C(intervals)). At O(concurrency) 1 the counters are also
    read after every request, and the mean acceptance length's interval comes from the spread over
    requests (a ratio estimator, Student's t for few requests) - at temperature 0 a request's outcome is
    fixed, and which requests were sent is the only chance in the measurement. Otherwise (concurrent
    requests, or fewer than 5 that drafted) drafts are taken as independent - vLLM accepts a prefix of
    every draft, so the per-position counts give the number of drafts with 0, 1, ..., k accepted tokens.
    Each position's acceptance is a binomial over drafts (Wilson interval). The acceptance rate, when
    every draft proposed k tokens, is (mean acceptance length - 1) / k and takes that interval.
    Requests that all give the same counts (the same walk) have no spread, so the interval is the point.
  - O(min_speedup) is checked on the point figure (tokens per second have no per-draft spread here).
  - Changes nothing on the box; C(changed) is always C(false).
options:
  base_url:
    description:
      - Root URL of the vLLM server, without C(/v1).
    type: str
    default: http://127.0.0.1:8000
  api_key:
    description:
      - API key of the server (its C(--api-key) or E(VLLM_API_KEY)), sent as a Bearer C(Authorization) header.
      - Leave unset for a server without a key.
    type: str
  model:
    description:
      - Model to send the requests to, as the server names it (C(--served-model-name)).
      - Default is the first model listed by C(/v1/models).
    type: str
  prompts:
    description:
      - "User messages to send, one chat completion each: C(messages=[{role: user, content: <prompt>}])."
      - Default is a built-in set of 32 varied chat prompts (code, facts, writing, reasoning).
      - Mutually exclusive with O(requests).
    type: list
    elements: str
  requests:
    description:
      - The operator's own traffic as the workload, e.g. one parsed line each of a JSONL file of real chat
        requests. Each is the body of a chat completion request with a non-empty C(messages) list; its own
        C(max_tokens) and C(temperature) win over O(max_tokens) and O(temperature), and any other key (e.g.
        C(top_p)) is sent as it is. C(model) and C(stream) are always the module's.
      - Mutually exclusive with O(prompts).
    type: list
    elements: dict
  num_prompts:
    description:
      - Number of requests of the first round; the workload (O(prompts), O(requests) or the built-in set) is
        used in order and cycled.
    type: int
    default: 8
  max_prompts:
    description:
      - The budget for measuring more. While a threshold's confidence interval straddles its floor, another
        round of O(num_prompts) requests is sent (the next ones of the workload), until the verdict is clear,
        O(max_prompts) requests have been sent or O(max_seconds) have passed.
      - At temperature 0 a repeated request repeats its outcome and adds no information, so give at least
        this many distinct requests.
      - Default (or anything below O(num_prompts)) is O(num_prompts), one round.
    type: int
  max_seconds:
    description: No further round starts after this many seconds of requests.
    type: int
    default: 600
  confidence:
    description:
      - Two-sided confidence level of the intervals (0 to 1, exclusive).
      - The acceptance rate and mean acceptance length pass a floor only when the whole interval is at or
        above it and fail when the whole interval is below it. An interval that still straddles its floor
        when the budget is spent fails (a drafter not shown to pay is not deployed).
    type: float
    default: 0.95
  max_tokens:
    description: C(max_tokens) of every request.
    type: int
    default: 64
  temperature:
    description: Sampling temperature of every request. Acceptance is only comparable at 0.
    type: float
    default: 0
  concurrency:
    description:
      - Number of requests in flight at once (threads). Speculation's gain shrinks with load, so a gate at
        1 and one at the expected load answer different questions.
    type: int
    default: 1
  timeout:
    description:
      - Seconds allowed for each HTTP request (C(/health), chat completions, C(/metrics), C(/v1/models)).
    type: int
    default: 120
  min_acceptance_rate:
    description: Fail when C(acceptance_rate) is below this (0 to 1).
    type: float
  min_mean_acceptance_length:
    description: Fail when C(mean_acceptance_length) is below this (1 to 1 + num_speculative_tokens).
    type: float
  min_speedup:
    description:
      - Fail when C(speedup) is below this. Needs O(baseline_tokens_per_second).
    type: float
  baseline_tokens_per_second:
    description:
      - Tokens per second of the same workload (same prompts, C(num_prompts), C(max_tokens), C(concurrency))
        against the same target served without speculative decoding. C(speedup) is
        C(tokens_per_second) divided by it; without it C(speedup) is null.
    type: float
  speculation:
    description:
      - Whether the server is expected to speculate. V(false) measures a baseline on the same target served
        without speculative decoding (C(/metrics) is not read; only throughput is returned), so thresholds on
        acceptance do not apply.
    type: bool
    default: true
extends_documentation_fragment:
  - action_common_attributes
  - action_common_attributes.facts
attributes:
  check_mode:
    support: full
    details:
      - The module runs in check mode too. It only reads C(/health), C(/metrics) and C(/v1/models) and sends
        chat completions, which change nothing on the box. The requests do reach the server and add to its
        counters.
  diff_mode:
    support: none
  facts:
    support: full
  platform:
    platforms: posix
notes:
  - Each failure is one distinct line. No server serving (C(/health) unreachable or not HTTP 200).
    An HTTP error (status and a short excerpt of the body). The API key refused (HTTP 401/403).
    C(/metrics) without spec-decode counters (C(speculative decoding is not enabled on <url>)).
    Spec-decode counters that went down, or were re-created, between the two scrapes (the server
    restarted; no rate is computed from that window). No draft tokens in the window. Every request failed.
  - Requests that fail are counted in C(errors) (the first message is in C(first_error)); the figures come
    from the others.
  - The window's counters include any other traffic the server handled at the same time; run it on a quiet
    server.
  - Requests to a loopback address bypass any proxy set in the environment.
author:
  - specfleet maintainers
"""

EXAMPLES = r"""
- name: Smoke-test speculative decoding on the local server
  vllm_spec_smoke:
    api_key: "{{ vllm_api_key }}"
    min_mean_acceptance_length: 2.2

- name: Gate on speedup against a baseline measured without speculation
  vllm_spec_smoke:
    base_url: http://127.0.0.1:8000
    api_key: "{{ vllm_api_key }}"
    model: kimi-k2.5
    num_prompts: 16
    max_tokens: 128
    baseline_tokens_per_second: "{{ vllm_baseline_tokens_per_second }}"
    min_speedup: 1.2
  tags: [molecule-idempotence-notest]

- name: Same workload at the expected load; keep the figures even when it fails
  vllm_spec_smoke:
    api_key: "{{ vllm_api_key }}"
    concurrency: 8
    num_prompts: 32
    min_acceptance_rate: 0.4
  register: spec_smoke_load
  ignore_errors: true

- name: Show the figures
  ansible.builtin.debug:
    msg: "{{ spec_smoke_load.ansible_facts.vllm_spec_smoke.reason }}"
"""

RETURN = r"""
passed:
  description: Whether every given threshold was met.
  returned: when the window could be measured
  type: bool
  sample: true
reason:
  description:
    - One line; the missed thresholds with their intervals, or C(passed:) and the headline figures.
  returned: when the window could be measured
  type: str
  sample: "mean_acceptance_length 2.14 [2.05, 2.23] < min_mean_acceptance_length 2.20"
ansible_facts:
  description: Facts added to C(ansible_facts).
  returned: when the window could be measured (also on a missed threshold)
  type: complex
  contains:
    vllm_spec_smoke:
      description: Speculative-decoding figures of the smoke test's window.
      returned: when the window could be measured
      type: complex
      contains:
        base_url:
          description: The server measured.
          type: str
          sample: http://127.0.0.1:8000
        model:
          description: The model the requests went to.
          type: str
          sample: kimi-k2.5
        concurrency:
          description: Requests in flight at once.
          type: int
          sample: 1
        max_tokens:
          description: C(max_tokens) of every request.
          type: int
          sample: 64
        temperature:
          description: Temperature of every request.
          type: float
          sample: 0.0
        acceptance_rate:
          description: Δaccepted / Δdraft_tokens over the window; null without draft tokens.
          type: float
          sample: 0.5183
        mean_acceptance_length:
          description: 1 + Δaccepted / Δdrafts over the window; null without drafts.
          type: float
          sample: 2.55
        per_position_acceptance:
          description:
            - Δaccepted_per_pos{position=i} / Δdrafts for i = 0, 1, ...; a position missing from a scrape
              counts as 0 there.
          type: list
          elements: float
          sample: [0.63, 0.40, 0.26]
        num_accepted_tokens_per_pos:
          description: Δ of C(vllm:spec_decode_num_accepted_tokens_per_pos_total) per position.
          type: list
          elements: int
          sample: [25, 16, 10]
        intervals:
          description:
            - Confidence intervals of the figures, at C(confidence); null without drafts.
            - C(method) says whether the spread was taken over requests or over drafts.
          type: dict
          sample:
            confidence: 0.95
            method: per request
            mean_acceptance_length: [2.31, 2.79]
            acceptance_rate: [0.437, 0.597]
            per_position_acceptance: [[0.48, 0.76], [0.27, 0.55], [0.15, 0.40]]
        per_request:
          description:
            - "Δdrafts and Δaccepted of each request, in order, as [drafts, accepted]; measured at
              O(concurrency) 1 only (empty otherwise)."
          type: list
          elements: list
          sample: [[5, 8], [4, 7]]
        verdicts:
          description:
            - For each threshold given, C(above), C(below) or C(straddles) (its interval against the floor;
              O(min_speedup) on the point figure), after the last round.
          type: dict
          sample: {min_mean_acceptance_length: above}
        rounds:
          description: Rounds of requests sent (more than one when an interval straddled its floor).
          type: int
          sample: 1
        workload_digest:
          description:
            - sha256 of the workload sent (the request bodies, in order, as canonical JSON, without the model
              name), so that reports on the same workload can be compared.
          type: str
          sample: 3b5d5c3712955042212316173ccf37be800ed2b6e4f8f6f9f1f0e0f5f2cf1b1f
        num_drafts:
          description: Δ of C(vllm:spec_decode_num_drafts_total).
          type: int
          sample: 40
        num_draft_tokens:
          description: Δ of C(vllm:spec_decode_num_draft_tokens_total).
          type: int
          sample: 120
        num_accepted_tokens:
          description: Δ of C(vllm:spec_decode_num_accepted_tokens_total).
          type: int
          sample: 62
        completion_tokens:
          description: Sum of the responses' C(usage.completion_tokens).
          type: int
          sample: 512
        tokens_per_second:
          description: completion_tokens / elapsed_s.
          type: float
          sample: 1234.5
        elapsed_s:
          description: Wall time of the request phase, in seconds.
          type: float
          sample: 0.415
        requests:
          description: Requests sent.
          type: int
          sample: 8
        errors:
          description: Requests that failed.
          type: int
          sample: 0
        first_error:
          description: The message of the first failed request; null when none failed.
          type: str
          sample: null
        baseline_tokens_per_second:
          description: The O(baseline_tokens_per_second) given, or null.
          type: float
          sample: 810.0
        speedup:
          description: tokens_per_second / baseline_tokens_per_second; null without a baseline.
          type: float
          sample: 1.524
        passed:
          description: Same as the top-level C(passed).
          type: bool
          sample: true
        reason:
          description: Same as the top-level C(reason).
          type: str
          sample: "passed: acceptance_rate 1.00, mean acceptance length 4.00, 1234.5 tok/s"
"""

import hashlib
import json
import time
import urllib.parse
from concurrent.futures import ThreadPoolExecutor

from ansible.module_utils import spec_stats
from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.prometheus_text import (
    PrometheusParseError,
    format_series,
    parse,
    series_key,
)
from ansible.module_utils.vllm_api import (
    AuthFailed,
    HttpError,
    VllmApiError,
    check_healthy,
    excerpt,
    get_json,
    get_text,
    post_json,
)

DRAFTS = "vllm:spec_decode_num_drafts_total"
DRAFT_TOKENS = "vllm:spec_decode_num_draft_tokens_total"
ACCEPTED = "vllm:spec_decode_num_accepted_tokens_total"
ACCEPTED_PER_POS = "vllm:spec_decode_num_accepted_tokens_per_pos_total"
SPEC_COUNTERS = (DRAFTS, DRAFT_TOKENS, ACCEPTED, ACCEPTED_PER_POS)
MODEL_LABEL = "model_name"
POSITION_LABEL = "position"

# Ordinary chat requests of different kinds; never random tokens (their degenerate loops inflate acceptance).
# Distinct, so that a gate that measures more (max_prompts) learns something from every one at temperature 0.
DEFAULT_PROMPTS = (
    "Explain what a hash table is and when you would use one, in three sentences.",
    "Write a Python function that returns the n-th Fibonacci number iteratively, with a docstring.",
    "What causes the seasons on Earth? Answer for a curious twelve-year-old.",
    "Summarize the plot of Romeo and Juliet in one short paragraph.",
    "Give me five tips for writing clear git commit messages.",
    "Translate into French: 'The train to Lyon leaves at half past eight from platform four.'",
    "A shop sells pencils at 3 for 50 cents. How much do 18 pencils cost? Show your reasoning step by step.",
    "Write a haiku about autumn rain on a city street.",
    "Compare TCP and UDP in a short table with three rows.",
    "Draft a polite email asking a colleague to review a pull request by Friday.",
    "Write a SQL query that returns the ten customers with the highest total order value.",
    "What is the difference between a process and a thread? Keep it under 100 words.",
    "Explain photosynthesis as a short list of steps.",
    "Suggest three names for a bakery that specialises in sourdough bread.",
    "Write a bash one-liner that counts the lines of every .py file under the current directory.",
    "Why does ice float on water?",
    "Give a short recipe for a vegetarian lentil soup.",
    "Explain the CAP theorem with one example for each trade-off.",
    "Rewrite this sentence in plain English: 'We will leverage synergies to operationalise our roadmap.'",
    "What were the main causes of the First World War? Answer in four bullet points.",
    "Write a JavaScript function that debounces another function.",
    "How do vaccines train the immune system? Explain simply.",
    "List the planets of the solar system with one fact about each.",
    "Write a limerick about a cat who learns to code.",
    "What does a load balancer do, and what are two common algorithms it uses?",
    "Convert 72 degrees Fahrenheit to Celsius and show the formula.",
    "Give me a packing list for a three-day hiking trip.",
    "Explain big-O notation with the examples of linear and binary search.",
    "Write a short motivational message for a team before a product launch.",
    "What is the difference between weather and climate?",
    "Describe how HTTPS protects a connection, step by step.",
    "Write a regular expression that matches an ISO 8601 date such as 2026-12-01, and explain it.",
)

THRESHOLDS = (
    # (fact, option, has an interval)
    ("acceptance_rate", "min_acceptance_rate", True),
    ("mean_acceptance_length", "min_mean_acceptance_length", True),
    ("speedup", "min_speedup", False),
)


class SpecSmokeError(Exception):
    """The window cannot be measured; str() is the one-line reason."""


def _model_selector(samples, model, url):
    """Predicate over spec-decode samples: the model's series, or all of them without a model_name label."""
    spec = [sample for sample in samples if sample.name in SPEC_COUNTERS]
    if not any(sample.name == DRAFTS for sample in spec):
        raise SpecSmokeError(f"speculative decoding is not enabled on {url}: /metrics has no {DRAFTS}")
    names = sorted({sample.labels[MODEL_LABEL] for sample in spec if MODEL_LABEL in sample.labels})
    if names and model is not None and model not in names:
        raise SpecSmokeError(
            f"{url}/metrics has spec-decode counters for model_name {', '.join(names)} but none for {model}"
        )
    return lambda sample: model is None or sample.labels.get(MODEL_LABEL, model) == model


def spec_series(samples, model=None, url="the server"):
    """{series_key: value} of the spec-decode counters of `model`; raises SpecSmokeError when there are none.

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
    """Raise SpecSmokeError when a counter went down, or a counter was re-created, between two scrapes.

    `before`/`after` are spec_series() results; a series missing from a scrape counts as 0 there.
    """
    backwards = []
    for key in sorted(set(before) | set(after)):
        old, new = before.get(key, 0.0), after.get(key, 0.0)
        if new < old:
            backwards.append(f"{_show(key, old)} -> {new:g}")
    if backwards:
        more = f" (and {len(backwards) - 1} more)" if len(backwards) > 1 else ""
        raise SpecSmokeError(
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
        raise SpecSmokeError(
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
                raise SpecSmokeError(
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
    """[drafts, accepted] of each request from the spec_series() read before the first and after each."""
    counts = []
    for before, after in zip(snapshots, snapshots[1:]):
        counts.append(
            [
                _count(_total(after, DRAFTS) - _total(before, DRAFTS)),
                _count(_total(after, ACCEPTED) - _total(before, ACCEPTED)),
            ]
        )
    return counts


def throughput(completion_tokens, elapsed_s, baseline=None):
    """(tokens_per_second, speedup) rounded as the fact shows them; speedup is None without a baseline."""
    tokens_per_second = round(completion_tokens / elapsed_s, 2) if elapsed_s > 0 else 0.0
    speedup = round(completion_tokens / elapsed_s / baseline, 4) if baseline and elapsed_s > 0 else None
    return tokens_per_second, speedup


def _pair(value, limit):
    """value and limit with 2 decimals, or as many more (up to 6) as it takes to show them different."""
    for digits in range(2, 7):
        shown = f"{value:.{digits}f}", f"{limit:.{digits}f}"
        if shown[0] != shown[1]:
            return shown
    return shown


def _with_interval(fact, shown, facts):
    interval = (facts.get("intervals") or {}).get(fact)
    return f"{shown} [{interval[0]:.2f}, {interval[1]:.2f}]" if interval else shown


def judge(facts, thresholds):
    """{option: "above" | "below" | "straddles"} for every threshold given ({option: limit or None}):
    the fact's interval against the floor where it has one, else the point figure."""
    verdicts = {}
    for fact, option, has_interval in THRESHOLDS:
        limit = thresholds.get(option)
        if limit is None:
            continue
        value = facts.get(fact)
        interval = (facts.get("intervals") or {}).get(fact) if has_interval else None
        if value is None:
            verdicts[option] = "below"
        elif interval:
            verdicts[option] = spec_stats.verdict(interval, limit)
        else:
            verdicts[option] = "above" if value >= limit else "below"
    return verdicts


def evaluate(facts, thresholds, verdicts=None, budget_spent=True):
    """(passed, reason) of the facts against {option: limit or None} (THRESHOLDS' option names).

    A straddling interval fails once the budget is spent (budget_spent); until then the caller measures
    more. `verdicts` defaults to judge(facts, thresholds).
    """
    verdicts = judge(facts, thresholds) if verdicts is None else verdicts
    missed = []
    for fact, option, _has_interval in THRESHOLDS:
        if option not in verdicts or verdicts[option] == "above":
            continue
        limit, value = thresholds[option], facts.get(fact)
        if value is None:
            missed.append(f"{fact} unknown, {option} {limit:.2f}")
            continue
        shown, wanted = _pair(value, limit)
        shown = _with_interval(fact, shown, facts)
        if verdicts[option] == "below":
            missed.append(f"{fact} {shown} < {option} {wanted}")
        elif budget_spent:
            missed.append(
                f"{fact} {shown} not shown >= {option} {wanted} after {facts['requests']} requests "
                f"(interval straddles the floor, budget spent)"
            )
    if missed:
        return False, "; ".join(missed)
    rate = _with_interval("acceptance_rate", f"{facts['acceptance_rate']:.2f}", facts)
    length = _with_interval("mean_acceptance_length", f"{facts['mean_acceptance_length']:.2f}", facts)
    reason = f"passed: acceptance_rate {rate}, mean acceptance length {length}"
    reason += f", {facts['tokens_per_second']:.1f} tok/s"
    if facts.get("speedup") is not None:
        reason += f", speedup {facts['speedup']:.2f}x"
    if facts.get("errors"):
        reason += f", {facts['errors']} of {facts['requests']} requests failed"
    return True, reason


def workload(items, count, start=0):
    """The workload items sent, in order: `items` cycled, `count` of them from position `start`."""
    return [items[i % len(items)] for i in range(start, start + count)]


def chat_requests(params):
    """The workload as chat request bodies: O(requests), or one user message per prompt."""
    if params["requests"] is not None:
        return [dict(request) for request in params["requests"]]
    return [{"messages": [{"role": "user", "content": p}]} for p in params["prompts"] or DEFAULT_PROMPTS]


def workload_digest(requests, max_tokens, temperature):
    """sha256 of what is sent: each body with the module's defaults filled in, canonical JSON, in order."""
    bodies = [{"max_tokens": max_tokens, "temperature": temperature, **request} for request in requests]
    return hashlib.sha256(json.dumps(bodies, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def chat_once(url, api_key, model, request, max_tokens, temperature, timeout):
    """One chat completion of a request body; return its usage.completion_tokens. Raises VllmApiError."""
    payload = {
        "max_tokens": max_tokens,
        "temperature": temperature,
        **request,
        "model": model,
        "stream": False,
    }
    status, body = post_json(url, payload, api_key=api_key, timeout=timeout)
    usage = body.get("usage") if isinstance(body, dict) else None
    tokens = usage.get("completion_tokens") if isinstance(usage, dict) else None
    if not isinstance(tokens, int) or isinstance(tokens, bool):
        raise HttpError(
            f"POST {url} returned HTTP {status} without usage.completion_tokens: {excerpt(json.dumps(body))}",
            url,
            status,
        )
    return tokens


def run_requests(
    url, api_key, model, requests, max_tokens, temperature, concurrency, timeout, after_each=None
):
    """Send every request with `concurrency` threads; return (completion_tokens, elapsed_s, errors).

    errors is a list of the VllmApiError of each failed request, in order. At concurrency 1, after_each()
    (when given) is called after every request: the per-request counters are read there.
    """

    def one(request):
        try:
            return chat_once(url, api_key, model, request, max_tokens, temperature, timeout), None
        except VllmApiError as exc:
            return 0, exc

    started = time.monotonic()
    if concurrency == 1:
        results = []
        for request in requests:
            results.append(one(request))
            if after_each:
                after_each()
    else:
        with ThreadPoolExecutor(max_workers=max(1, min(concurrency, len(requests)))) as pool:
            results = list(pool.map(one, requests))
    elapsed = time.monotonic() - started
    return sum(tokens for tokens, _error in results), elapsed, [error for _tokens, error in results if error]


def scrape(base_url, api_key, timeout):
    url = base_url + "/metrics"
    _status, text = get_text(url, api_key=api_key, timeout=timeout)
    try:
        return parse(text)
    except PrometheusParseError as exc:
        raise SpecSmokeError(f"cannot parse {url}: {exc}") from None


def first_model(base_url, api_key, timeout):
    url = base_url + "/v1/models"
    _status, body = get_json(url, api_key=api_key, timeout=timeout)
    data = body.get("data") if isinstance(body, dict) else None
    ids = [entry.get("id") for entry in data or [] if isinstance(entry, dict) and entry.get("id")]
    if not ids:
        raise SpecSmokeError(f"{url} lists no model: {excerpt(json.dumps(body))}")
    return ids[0]


def validate(params):
    """One-line complaint about the parameters, or None."""
    parts = urllib.parse.urlsplit(params["base_url"])
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return f"base_url must be http(s)://host[:port], got {params['base_url']!r}"
    if parts.path.rstrip("/").endswith("/v1"):
        return f"base_url is the server root, without /v1: got {params['base_url']!r}"
    for option in ("num_prompts", "max_tokens", "concurrency", "timeout", "max_seconds"):
        if params[option] < 1:
            return f"{option} must be at least 1, got {params[option]}"
    if params["temperature"] < 0:
        return f"temperature must be 0 or more, got {params['temperature']}"
    if not 0 < params["confidence"] < 1:
        return f"confidence must be between 0 and 1 (exclusive), got {params['confidence']}"
    if params["baseline_tokens_per_second"] is not None and params["baseline_tokens_per_second"] <= 0:
        return f"baseline_tokens_per_second must be above 0, got {params['baseline_tokens_per_second']}"
    if params["prompts"] is not None and (
        not params["prompts"] or not all(p.strip() for p in params["prompts"])
    ):
        return "prompts must be a non-empty list of non-empty strings"
    if params["requests"] is not None:
        if not params["requests"]:
            return "requests must be a non-empty list of chat request bodies"
        for index, request in enumerate(params["requests"], 1):
            messages = request.get("messages")
            if (
                not isinstance(messages, list)
                or not messages
                or not all(isinstance(m, dict) for m in messages)
            ):
                return f"requests[{index}] has no messages (a non-empty list of chat messages)"
    return None


ARGUMENT_SPEC = dict(
    base_url=dict(type="str", default="http://127.0.0.1:8000"),
    api_key=dict(type="str", no_log=True),
    model=dict(type="str"),
    prompts=dict(type="list", elements="str"),
    requests=dict(type="list", elements="dict"),
    num_prompts=dict(type="int", default=8),
    max_prompts=dict(type="int"),
    max_seconds=dict(type="int", default=600),
    confidence=dict(type="float", default=0.95),
    max_tokens=dict(type="int", default=64),
    temperature=dict(type="float", default=0.0),
    concurrency=dict(type="int", default=1),
    timeout=dict(type="int", default=120),
    min_acceptance_rate=dict(type="float"),
    min_mean_acceptance_length=dict(type="float"),
    min_speedup=dict(type="float"),
    baseline_tokens_per_second=dict(type="float"),
    speculation=dict(type="bool", default=True),
)


class Measurement:
    """The counters read before the first request and after each round (and each request at concurrency 1)."""

    def __init__(self, module, base_url, model):
        self.module, self.base_url, self.model = module, base_url, model
        params = module.params
        self.api_key, self.timeout = params["api_key"], params["timeout"]
        self.speculation = params["speculation"]
        self.first = scrape(base_url, self.api_key, self.timeout)
        self.snapshots = [spec_series(self.first.samples, model, base_url)] if self.speculation else []
        self.per_request = params["concurrency"] == 1 and self.speculation
        self.completion_tokens, self.elapsed, self.errors, self.sent = 0, 0.0, [], 0

    def read_series(self):
        samples = scrape(self.base_url, self.api_key, self.timeout).samples
        return samples, spec_series(samples, self.model, self.base_url)

    def after_request(self):
        self.snapshots.append(self.read_series()[1])

    def round(self, requests):
        params = self.module.params
        tokens, elapsed, errors = run_requests(
            self.base_url + "/v1/chat/completions",
            self.api_key,
            self.model,
            requests,
            params["max_tokens"],
            params["temperature"],
            params["concurrency"],
            self.timeout,
            after_each=self.after_request if self.per_request else None,
        )
        self.completion_tokens += tokens
        self.elapsed += elapsed
        self.errors += errors
        self.sent += len(requests)

    def window(self):
        """Spec-decode figures from the first read to now, with intervals."""
        samples, last = self.read_series()
        check_no_restart(
            self.snapshots[0],
            last,
            created_series(self.first.samples, self.model),
            created_series(samples, self.model),
        )
        figures = window_metrics(self.snapshots[0], last)
        counts = per_request_counts(self.snapshots) if self.per_request else []
        figures["per_request"] = counts
        figures["intervals"] = spec_stats.intervals(
            figures, self.module.params["confidence"], per_request=[tuple(pair) for pair in counts]
        )
        return figures


def main():
    module = AnsibleModule(
        argument_spec=ARGUMENT_SPEC,
        mutually_exclusive=[("prompts", "requests")],
        required_by={"min_speedup": "baseline_tokens_per_second"},
        supports_check_mode=True,
    )
    params = module.params
    problem = validate(params)
    if problem:
        module.fail_json(msg=problem)
    base_url = params["base_url"].rstrip("/")
    api_key, timeout = params["api_key"], params["timeout"]
    per_round = params["num_prompts"]
    budget = max(per_round, params["max_prompts"] or per_round)
    items = chat_requests(params)
    sent_workload = workload(items, per_round)

    try:
        check_healthy(base_url, api_key=api_key, timeout=timeout)
        model = params["model"] or first_model(base_url, api_key, timeout)
        measured = Measurement(module, base_url, model)
        measured.round(sent_workload)
    except (VllmApiError, SpecSmokeError) as exc:
        module.fail_json(msg=str(exc))

    def figures():
        tokens_per_second, speedup = throughput(
            measured.completion_tokens, measured.elapsed, params["baseline_tokens_per_second"]
        )
        return {
            "base_url": base_url,
            "model": model,
            "concurrency": params["concurrency"],
            "max_tokens": params["max_tokens"],
            "temperature": params["temperature"],
            "requests": measured.sent,
            "errors": len(measured.errors),
            "first_error": str(measured.errors[0]) if measured.errors else None,
            "completion_tokens": measured.completion_tokens,
            "elapsed_s": round(measured.elapsed, 3),
            "tokens_per_second": tokens_per_second,
            "baseline_tokens_per_second": params["baseline_tokens_per_second"],
            "speedup": speedup,
            "workload_digest": workload_digest(sent_workload, params["max_tokens"], params["temperature"]),
        }

    facts = figures()
    if len(measured.errors) == measured.sent:
        first = measured.errors[0]
        if isinstance(first, AuthFailed):
            module.fail_json(msg=str(first), ansible_facts={"vllm_spec_smoke": facts})
        module.fail_json(
            msg=f"all {measured.sent} chat requests failed; first error: {first}",
            ansible_facts={"vllm_spec_smoke": facts},
        )

    if not params["speculation"]:
        reason = f"baseline without speculation: {facts['tokens_per_second']} tok/s"
        facts["passed"], facts["reason"] = True, reason
        module.exit_json(changed=False, passed=True, reason=reason, ansible_facts={"vllm_spec_smoke": facts})

    rounds = 1
    while True:
        try:
            facts.update(measured.window())
        except (VllmApiError, SpecSmokeError) as exc:
            module.fail_json(msg=str(exc), ansible_facts={"vllm_spec_smoke": facts})
        if not facts["num_draft_tokens"]:
            module.fail_json(
                msg=(
                    f"no draft tokens in the window: {measured.sent - len(measured.errors)} request(s) "
                    f"produced {measured.completion_tokens} completion tokens but {base_url} drafted none"
                ),
                ansible_facts={"vllm_spec_smoke": facts},
            )
        verdicts = judge(facts, params)
        undecided = "straddles" in verdicts.values() and "below" not in verdicts.values()
        if not undecided or measured.sent >= budget or measured.elapsed >= params["max_seconds"]:
            break
        more = workload(items, min(per_round, budget - measured.sent), start=measured.sent)
        try:
            measured.round(more)
        except (VllmApiError, SpecSmokeError) as exc:
            module.fail_json(msg=str(exc), ansible_facts={"vllm_spec_smoke": facts})
        sent_workload += more
        rounds += 1
        facts.update(figures())

    passed, reason = evaluate(facts, params, verdicts)
    facts.update(verdicts=verdicts, rounds=rounds, passed=passed, reason=reason)
    result = dict(changed=False, passed=passed, reason=reason, ansible_facts={"vllm_spec_smoke": facts})
    if not passed:
        module.fail_json(msg=reason, **result)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
