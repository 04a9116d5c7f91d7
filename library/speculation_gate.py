#!/usr/bin/python
"""Ansible module: smoke-test speculative decoding on a running vLLM server from its spec-decode counters."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: speculation_gate
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
  - Returns the figures as the C(speculation_gate) fact together with C(passed) and a one-line C(reason).
    When a threshold is given and missed, the task fails with that reason and the figures stay in the
    result (C(ansible_facts.speculation_gate)).
  - Measure on chat prompts at temperature 0 (the defaults). Random tokens with C(ignore_eos) loop and
    inflate acceptance, so the built-in prompts are ordinary chat requests.
  - The figures come with confidence intervals (C(intervals)) from the spread over requests (a ratio
    estimator, Student's t for few requests) - at temperature 0 a request's outcome is fixed, and which
    requests were sent is the only chance in the measurement. So identical requests are one request
    (the workload is sent without repeats, and the budget is at most its distinct requests), and each
    request's own counts are needed - read from its response where the server gives them (vLLM 0.32 on,
    served with C(--per-request-spec-decode-metrics summary)), else at O(concurrency) 1 from the counters
    read after every request. Drafts are never taken as independent. Without per-request counts
    (concurrent requests to a server without per-request figures), or with fewer than 5 requests that
    drafted, the mean acceptance length and acceptance rate have no interval, and a floor on them fails
    saying why, unless O(point_figure) allows a verdict on the point figure.
  - Each position's acceptance is shown with a Wilson interval over drafts (for reading; no verdict uses it).
    Requests that all give the same counts (the same walk) have no spread, so the interval is the point.
  - O(min_speedup) is checked on the point figure (tokens per second have no per-request spread here).
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
        used in order, its repeats left out, never more than its distinct requests.
    type: int
    default: 8
  max_prompts:
    description:
      - The budget for measuring more. While a threshold's confidence interval straddles its floor, another
        round of O(num_prompts) requests is sent (the next ones of the workload), until the verdict is clear,
        O(max_prompts) requests have been sent or O(max_time_s) have passed.
      - At temperature 0 a repeated request repeats its outcome and adds no information, so the budget is
        at most the workload's distinct requests.
      - Default (or anything below O(num_prompts)) is O(num_prompts), one round.
    type: int
  max_time_s:
    description: No further round starts after this many seconds of requests. Was max_seconds (still taken).
    aliases: [max_seconds]
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
  timeout_s:
    description:
      - Seconds allowed for each HTTP request (C(/health), chat completions, C(/metrics), C(/v1/models)).
      - Was timeout (still taken).
    aliases: [timeout]
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
      - Fail when C(speedup) is below this. Needs O(baseline_per_round) or O(baseline_tokens_per_second).
    type: float
  baseline_per_round:
    description:
      - The baseline round by round, as a run with O(speculation=false) returns it (C(per_round)), that is
        C([completion_tokens, seconds]) of each round of O(num_prompts) requests of the same workload, over
        the whole budget (O(max_prompts)), against the same target served without speculative decoding.
        C(speedup) compares the rounds this run sent with the same rounds of the baseline, the same
        requests, whatever round the verdict comes at.
    type: list
    elements: list
  baseline_tokens_per_second:
    description:
      - Tokens per second of the same workload (same prompts, C(num_prompts), C(max_tokens), C(concurrency))
        against the same target served without speculative decoding, as one figure. C(speedup) is
        C(tokens_per_second) divided by it; without it (or O(baseline_per_round)) C(speedup) is null.
    type: float
  speculative_config:
    description:
      - The server's speculative config (its C(num_speculative_tokens) and any
        C(num_speculative_tokens_per_batch_size) schedule). With it, C(k) is the number of tokens the server
        drafts at batch size O(concurrency), and at concurrency 1 (or without a schedule) the module fails
        when the server drafts another number (the config did not take).
    type: dict
  floors_by_k:
    description:
      - >-
        The acceptance floors at each k the server may draft, C({"1": {"mean_acceptance_length": 1.61,
        "acceptance_rate": 0.61}, "2": ...}), as roles/served computes them once per box from the floors
        stated at one k (its C(served_floors.by_k), filter_plugins/spec_floors.py; 2.2 at k=3 is 1.61 at k=1).
        With O(speculative_config), the floors in force are those at the served C(k), replacing
        O(min_mean_acceptance_length) and O(min_acceptance_rate); a figure the table lacks is not checked.
        Where the responses carry each verify step's draft length (C(--per-request-spec-decode-metrics
        detailed)) and a schedule drafted several, each floor is the one expected over that mix
        (C(draft_lengths)): the mean length's averaged over the verify steps, the rate's over the drafted
        tokens. Without it the floors are taken as given at every k.
    type: dict
  best:
    description:
      - The best figures this box recorded for the same workload and k (roles/transaction keeps them with
        each last known good), C(mean_acceptance_length) and optionally C(tokens_per_second), each with
        its date (C(mean_acceptance_length_at), C(tokens_per_second_at)). With O(max_regression), a
        figure more than that fraction under its best fails, even above the absolute floors
        (C(min_mean_acceptance_length_vs_best), C(min_tokens_per_second_vs_best)). The best, not the
        latest, so that changes each within the margin cannot add up to a large drop.
    type: dict
  max_regression:
    description: Fraction (0 to 1) a figure may fall under O(best); 0 or unset compares nothing.
    type: float
  regression_figures:
    description:
      - Which figures are compared with O(best). Tokens per second is only meaningful where the box's
        load is steady (not on two shared CPU cores).
    type: list
    elements: str
    choices: [mean_acceptance_length, tokens_per_second]
    default: [mean_acceptance_length, tokens_per_second]
  point_figure:
    description:
      - Judge the acceptance floors on the point figures where there is no interval (fewer than 5 distinct
        requests that drafted, or no per-request counts under concurrency); the verdict says so. Without it
        such a floor fails, saying why.
    type: bool
    default: false
  speculation:
    description:
      - Whether the server is expected to speculate. V(false) measures a baseline on the same target served
        without speculative decoding (C(/metrics) is not read; only throughput is returned), so thresholds on
        acceptance do not apply. It sends the whole budget, round by round (C(per_round)), so that a
        speculative run compares like with like after any round.
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
  speculation_gate:
    api_key: "{{ vllm_api_key }}"
    min_mean_acceptance_length: 2.2

- name: Gate on speedup against a baseline measured without speculation
  speculation_gate:
    base_url: http://127.0.0.1:8000
    api_key: "{{ vllm_api_key }}"
    model: kimi-k2.5
    num_prompts: 16
    max_tokens: 128
    baseline_tokens_per_second: "{{ vllm_baseline_tokens_per_second }}"
    min_speedup: 1.2
  tags: [molecule-idempotence-notest]

- name: Same workload at the expected load; keep the figures even when it fails
  speculation_gate:
    api_key: "{{ vllm_api_key }}"
    concurrency: 8
    num_prompts: 32
    min_acceptance_rate: 0.4
  register: spec_smoke_load
  ignore_errors: true

- name: Show the figures
  ansible.builtin.debug:
    msg: "{{ spec_smoke_load.ansible_facts.speculation_gate.reason }}"
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
    speculation_gate:
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
            - C(method) is C(per request), or null where the mean acceptance length and the acceptance rate
              have no interval (they are null then); C(requests) counts the requests that drafted.
          type: dict
          sample:
            confidence: 0.95
            method: per request
            requests: 8
            mean_acceptance_length: [2.31, 2.79]
            acceptance_rate: [0.437, 0.597]
            per_position_acceptance: [[0.48, 0.76], [0.27, 0.55], [0.15, 0.40]]
        per_request:
          description:
            - "Each request's drafts, accepted tokens and draft tokens, in order, as [drafts, accepted,
              draft_tokens]: from its response, else at O(concurrency) 1 from the counters read after it;
              empty without either."
          type: list
          elements: list
          sample: [[5, 8, 15], [4, 7, 12]]
        per_request_source:
          description: Where C(per_request) came from, C(responses) or C(counters); null when it is empty.
          type: str
          sample: counters
        draft_lengths:
          description:
            - The lengths the server drafted, with each one's verify steps and mean acceptance length,
              where every response said them (a server with C(--per-request-spec-decode-metrics
              detailed)); else null. Under a C(num_speculative_tokens_per_batch_size) schedule at a
              concurrency above 1 the batch size moves and so does the length; with O(floors_by_k) the
              floors are then those of this mix (C(floors)).
          type: list
          elements: dict
          sample:
            - {"k": 1, "drafts": 130, "mean_acceptance_length": 1.9091}
            - {"k": 3, "drafts": 2, "mean_acceptance_length": 2.0}
        distinct_requests:
          description: Distinct requests in the workload (identical bodies are one); the budget's limit.
          type: int
          sample: 32
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
          description:
            - The baseline the speedup is over - O(baseline_per_round) over the rounds this run sent, or
              O(baseline_tokens_per_second) - or null.
          type: float
          sample: 810.0
        speedup:
          description: tokens_per_second / baseline_tokens_per_second; null without a baseline.
          type: float
          sample: 1.524
        k:
          description: Tokens the server drafts at this concurrency by O(speculative_config); null without it.
          type: int
          sample: 3
        floors:
          description: The floors applied (those at C(k) or its mix with O(floors_by_k)), by option name.
          type: dict
          sample: {"min_acceptance_rate": 0.488, "min_mean_acceptance_length": 1.976, "min_speedup": null}
        passed:
          description: Same as the top-level C(passed).
          type: bool
          sample: true
        reason:
          description: Same as the top-level C(reason).
          type: str
          sample: "passed: acceptance 0.79 [0.74, 0.84], mean length 3.37 [3.21, 3.52], per position
            0.89/0.79/0.68, 245.1 tok/s, 8 distinct requests in 1 round"
        per_round:
          description: C([completion_tokens, seconds]) of each round of requests sent, in order.
          type: list
          elements: list
          sample: [[512, 2.04], [498, 1.97]]
        summary:
          description:
            - The figures in one line, each rounded to what its interval supports, with the requests they
              come from.
          type: str
          sample: "acceptance 0.79 [0.74, 0.84], mean length 3.37 [3.21, 3.52], per position 0.89/0.79/0.68,
            245.1 tok/s, 8 distinct requests in 1 round"
"""

import json
import urllib.parse

from ansible.module_utils import spec_stats
from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.chat_load import (
    chat_requests,
    distinct_requests,
    run_requests,
    workload,
    workload_digest,
)
from ansible.module_utils.spec_metrics import (
    SpecMetricsError,
    check_no_restart,
    created_series,
    per_request_counts,
    scrape,
    spec_series,
    window_metrics,
)
from ansible.module_utils.spec_schedule import SCHEDULE_KEY, k_for_batch
from ansible.module_utils.vllm_api import AuthFailed, VllmApiError, check_healthy, excerpt, get_json

THRESHOLDS = (
    # (fact, option, has an interval)
    ("acceptance_rate", "min_acceptance_rate", True),
    ("mean_acceptance_length", "min_mean_acceptance_length", True),
    ("speedup", "min_speedup", False),
    # Floors derived from the box's best record (options best and max_regression), not options themselves.
    ("mean_acceptance_length", "min_mean_acceptance_length_vs_best", True),
    ("tokens_per_second", "min_tokens_per_second_vs_best", False),
)
VS_BEST = "_vs_best"
# A floor on a figure that has no interval, and may not be judged on its point figure.
NO_INTERVAL = "no interval"


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


def _interval(fact, facts):
    return (facts.get("intervals") or {}).get(fact)


def judge(facts, thresholds, point_figure=False):
    """{option: "above" | "below" | "straddles" | "no interval"} for every threshold given ({option: limit
    or None}): the fact's interval against the floor where it has one, else the point figure (for a fact
    with an interval only where point_figure allows it)."""
    verdicts = {}
    for fact, option, has_interval in THRESHOLDS:
        limit = thresholds.get(option)
        if limit is None:
            continue
        value = facts.get(fact)
        interval = _interval(fact, facts) if has_interval else None
        if value is None:
            verdicts[option] = "below"
        elif interval:
            verdicts[option] = spec_stats.verdict(interval, limit)
        elif has_interval and not point_figure:
            verdicts[option] = NO_INTERVAL
        else:
            verdicts[option] = "above" if value >= limit else "below"
    return verdicts


def why_no_interval(facts):
    """Why the acceptance figures have no interval, in words, with what would give them one."""
    if not facts.get("per_request_source"):
        return (
            f"no per-request figures from {facts['requests']} requests at concurrency {facts['concurrency']} "
            "(serve with --per-request-spec-decode-metrics summary, or measure at concurrency 1)"
        )
    drafted = (facts.get("intervals") or {}).get("requests", 0)
    return (
        f"{drafted} distinct request{'' if drafted == 1 else 's'} drafted, an interval needs "
        f"{spec_stats.MIN_REQUESTS} (add distinct requests to the workload, or allow point_figure)"
    )


def evaluate(facts, thresholds, verdicts=None):
    """(passed, reason) of the facts against {option: limit or None} (THRESHOLDS' option names), once the
    measuring is over: an interval that still straddles its floor fails. `verdicts` defaults to
    judge(facts, thresholds).
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
        interval = _interval(fact, facts)
        shown, wanted = _pair(value, limit)
        shown = spec_stats.shown(value, interval) if interval else shown
        if option.endswith(VS_BEST):
            best = facts["best"]
            margin = f"{facts['max_regression']:.0%}"
            wanted += f" ({margin} under the best {float(best[fact]):.2f} of {best.get(fact + '_at', '?')})"
        if verdicts[option] == "below":
            missed.append(f"{fact} {shown} < {option} {wanted}")
        elif verdicts[option] == NO_INTERVAL:
            missed.append(
                f"{fact} {shown} not shown >= {option} {wanted}: no interval, {why_no_interval(facts)}"
            )
        else:
            missed.append(
                f"{fact} {shown} not shown >= {option} {wanted} after {facts['requests']} distinct requests "
                f"(interval straddles the floor, budget spent)"
            )
    if missed:
        return False, "; ".join(missed)
    reason = f"passed: {summary(facts)}"
    if any(verdicts.get(option) and not _interval(fact, facts) for fact, option, has in THRESHOLDS if has):
        reason += ", judged on the point figures (point_figure)"
    if facts.get("errors"):
        reason += f", {facts['errors']} of {facts['requests']} requests failed"
    return True, reason


def summary(facts):
    """The figures in one line, each with the digits its interval supports, and what they come from."""
    parts = []
    for fact, name in (("acceptance_rate", "acceptance"), ("mean_acceptance_length", "mean length")):
        if facts.get(fact) is not None:
            interval = _interval(fact, facts)
            point = "" if interval else " (no interval)"
            parts.append(f"{name} {spec_stats.shown(facts[fact], interval)}{point}")
    if facts.get("per_position_acceptance"):
        parts.append("per position " + "/".join(f"{rate:.2f}" for rate in facts["per_position_acceptance"]))
    parts.append(f"{facts['tokens_per_second']:.1f} tok/s")
    if facts.get("speedup") is not None:
        parts.append(f"speedup {facts['speedup']:.2f}x")
    rounds = facts.get("rounds", 1)
    parts.append(f"{facts['requests']} distinct requests in {rounds} round{'s' if rounds != 1 else ''}")
    return ", ".join(parts)


def first_model(base_url, api_key, timeout):
    url = base_url + "/v1/models"
    _status, body = get_json(url, api_key=api_key, timeout=timeout)
    data = body.get("data") if isinstance(body, dict) else None
    ids = [entry.get("id") for entry in data or [] if isinstance(entry, dict) and entry.get("id")]
    if not ids:
        raise SpecMetricsError(f"{url} lists no model: {excerpt(json.dumps(body))}")
    return ids[0]


def validate(params):
    """One-line complaint about the parameters, or None."""
    parts = urllib.parse.urlsplit(params["base_url"])
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return f"base_url must be http(s)://host[:port], got {params['base_url']!r}"
    if parts.path.rstrip("/").endswith("/v1"):
        return f"base_url is the server root, without /v1: got {params['base_url']!r}"
    for option in ("num_prompts", "max_tokens", "concurrency", "timeout_s", "max_time_s"):
        if params[option] < 1:
            return f"{option} must be at least 1, got {params[option]}"
    if params["temperature"] < 0:
        return f"temperature must be 0 or more, got {params['temperature']}"
    if not 0 < params["confidence"] < 1:
        return f"confidence must be between 0 and 1 (exclusive), got {params['confidence']}"
    for k, at_k in (params["floors_by_k"] or {}).items():
        if not str(k).isdigit() or int(k) < 1 or not isinstance(at_k, dict):
            return f"floors_by_k maps each k (1 or more) to its floors, got {k!r}: {at_k!r}"
    served = served_k(params) if params["floors_by_k"] else None
    if served and str(served) not in {str(k) for k in params["floors_by_k"]}:
        return f"floors_by_k has no floors at the served k={served}"
    if params["max_regression"] is not None and not 0 <= params["max_regression"] < 1:
        return f"max_regression must be from 0 to 1 (a fraction), got {params['max_regression']}"
    if params["baseline_tokens_per_second"] is not None and params["baseline_tokens_per_second"] <= 0:
        return f"baseline_tokens_per_second must be above 0, got {params['baseline_tokens_per_second']}"
    rounds = params["baseline_per_round"]
    if rounds is not None and not (
        rounds and all(len(r) == 2 and r[0] >= 0 and r[1] > 0 for r in rounds) and sum(r[0] for r in rounds)
    ):
        return "baseline_per_round must be [completion_tokens, seconds] rounds with tokens and time in them"
    if params["min_speedup"] is not None and rounds is None and params["baseline_tokens_per_second"] is None:
        return "min_speedup needs a baseline: baseline_per_round or baseline_tokens_per_second"
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
    max_time_s=dict(type="int", default=600, aliases=["max_seconds"]),
    confidence=dict(type="float", default=0.95),
    max_tokens=dict(type="int", default=64),
    temperature=dict(type="float", default=0.0),
    concurrency=dict(type="int", default=1),
    timeout_s=dict(type="int", default=120, aliases=["timeout"]),
    min_acceptance_rate=dict(type="float"),
    min_mean_acceptance_length=dict(type="float"),
    min_speedup=dict(type="float"),
    baseline_per_round=dict(type="list", elements="list"),
    baseline_tokens_per_second=dict(type="float"),
    speculative_config=dict(type="dict"),
    floors_by_k=dict(type="dict"),
    best=dict(type="dict"),
    max_regression=dict(type="float"),
    regression_figures=dict(
        type="list",
        elements="str",
        choices=["mean_acceptance_length", "tokens_per_second"],
        default=["mean_acceptance_length", "tokens_per_second"],
    ),
    point_figure=dict(type="bool", default=False),
    speculation=dict(type="bool", default=True),
)


def served_k(params):
    """Tokens drafted at batch size `concurrency` under the speculative config; None without one."""
    config = params["speculative_config"]
    if not config or not config.get("num_speculative_tokens"):
        return None
    k = int(config["num_speculative_tokens"])
    return k_for_batch(config.get(SCHEDULE_KEY), params["concurrency"], k)


def floors(params, k, lengths=None):
    """{option: floor} in force: as given, or with floors_by_k those at the served k - or, where the
    responses said which lengths the server drafted ({length: verify steps}) and they are not all k, those
    expected over that mix (a schedule drafts by the batch size of each step); and, with a best record and
    max_regression, each compared figure's best less the margin."""
    thresholds = {
        option: params[option] for _fact, option, _has_interval in THRESHOLDS if not option.endswith(VS_BEST)
    }
    best, margin = params.get("best") or {}, params.get("max_regression")
    for fact in params.get("regression_figures") or () if margin else ():
        if best.get(fact):
            thresholds[f"min_{fact}{VS_BEST}"] = round(float(best[fact]) * (1 - margin), 4)
    if params.get("floors_by_k") and k:
        mix = lengths if lengths and set(lengths) != {k} else {k: 1}
        for figure, floor in floors_over_mix(params["floors_by_k"], mix).items():
            thresholds[f"min_{figure}"] = floor
    return thresholds


def floors_over_mix(floors_by_k, lengths):
    """{figure: floor} expected over verify steps that drafted a mix of lengths ({length: steps}): each
    length's floor from the table (no draft: a mean length of 1), the mean length's averaged over the steps
    and the rate's over the drafted tokens. A figure missing at some length is not checked (None)."""
    table = {int(k): at_k for k, at_k in floors_by_k.items()}
    missing = sorted(d for d in lengths if d and d not in table)
    if missing:
        covers = f"k={min(table)}..{max(table)}" if table else "no k"
        raise ValueError(
            f"floors_by_k has no floors at k={', '.join(map(str, missing))} (it covers {covers})"
        )
    steps, drafted = sum(lengths.values()), sum(d * n for d, n in lengths.items())
    mixed = {}
    for figure in ("mean_acceptance_length", "acceptance_rate"):
        if not all(figure in table[d] for d in lengths if d):
            mixed[figure] = None
        elif figure == "mean_acceptance_length":
            mixed[figure] = round(
                sum(n * (table[d][figure] if d else 1) for d, n in lengths.items()) / steps, 4
            )
        else:
            rate = (
                sum(n * d * table[d][figure] for d, n in lengths.items() if d) / drafted if drafted else None
            )
            mixed[figure] = None if rate is None else round(rate, 4)
    return mixed


def drafted_as_configured(facts, k, params):
    """One line when the server drafted another number of tokens than its config says at this
    concurrency (checked at concurrency 1, or without a schedule, where the batch size is known)."""
    if k is None or not facts["num_drafts"]:
        return None
    if params["concurrency"] > 1 and (params["speculative_config"] or {}).get(SCHEDULE_KEY):
        return None
    drafted = facts["num_draft_tokens"] / facts["num_drafts"]
    if abs(drafted - k) > 1e-9:
        return (
            f"the server drafts {drafted:.2f} tokens per draft at concurrency {params['concurrency']}, "
            f"where its speculative config says k={k}"
        )
    return None


class Measurement:
    """The counters read before the first request and after each round (and each request at concurrency 1),
    and each request's own counts where its response carries them."""

    def __init__(self, module, base_url, model):
        self.module, self.base_url, self.model = module, base_url, model
        params = module.params
        self.api_key, self.timeout = params["api_key"], params["timeout_s"]
        self.speculation = params["speculation"]
        self.k = served_k(params)
        self.first = scrape(base_url, self.api_key, self.timeout)
        self.snapshots = [spec_series(self.first.samples, model, base_url)] if self.speculation else []
        self.read_after_each = params["concurrency"] == 1 and self.speculation
        self.completion_tokens, self.elapsed, self.errors, self.sent = 0, 0.0, [], 0
        self.from_responses, self.lengths, self.per_round = [], [], []

    def read_series(self):
        samples = scrape(self.base_url, self.api_key, self.timeout).samples
        return samples, spec_series(samples, self.model, self.base_url)

    def after_request(self):
        self.snapshots.append(self.read_series()[1])

    def round(self, requests):
        params = self.module.params
        tokens, elapsed, errors, counts, lengths = run_requests(
            self.base_url + "/v1/chat/completions",
            self.api_key,
            self.model,
            requests,
            params["max_tokens"],
            params["temperature"],
            params["concurrency"],
            self.timeout,
            after_each=self.after_request if self.read_after_each else None,
        )
        self.completion_tokens += tokens
        self.elapsed += elapsed
        self.per_round.append([tokens, round(elapsed, 4)])
        self.errors += errors
        self.sent += len(requests)
        self.from_responses += counts
        self.lengths += lengths

    def per_request(self):
        """(counts of each request, where they came from): the responses' own where every answered
        request carried them, else the counters read after each request; ([], None) without either."""
        answered = [counts for counts in self.from_responses if counts is not None]
        if answered and len(answered) == self.sent - len(self.errors):
            return answered, "responses"
        if self.read_after_each:
            return per_request_counts(self.snapshots), "counters"
        return [], None

    def draft_lengths(self):
        """{draft length: [verify steps, accepted draft tokens]} over the requests, where every answered
        request's response said (--per-request-spec-decode-metrics detailed); None otherwise."""
        answered = [lengths for lengths in self.lengths if lengths is not None]
        if not answered or len(answered) != self.sent - len(self.errors):
            return None
        merged = {}
        for lengths in answered:
            for length, (steps, taken) in lengths.items():
                entry = merged.setdefault(length, [0, 0])
                entry[0] += steps
                entry[1] += taken
        return dict(sorted(merged.items())) or None

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
        if self.k is not None and figures["num_draft_tokens"] == self.k * figures["num_drafts"]:
            # A schedule drafting fewer than num_speculative_tokens leaves the last positions at 0.
            figures["num_accepted_tokens_per_pos"] = figures["num_accepted_tokens_per_pos"][: self.k]
            figures["per_position_acceptance"] = figures["per_position_acceptance"][: self.k]
        counts, source = self.per_request()
        figures.update(per_request=counts, per_request_source=source)
        lengths = self.draft_lengths()
        figures["draft_lengths"] = (
            [
                {"k": length, "drafts": steps, "mean_acceptance_length": round(1 + taken / steps, 4)}
                for length, (steps, taken) in lengths.items()
                if steps
            ]
            if lengths
            else None
        )
        figures["intervals"] = spec_stats.intervals(
            figures, self.module.params["confidence"], per_request=counts
        )
        return figures


def main():
    module = AnsibleModule(
        argument_spec=ARGUMENT_SPEC,
        mutually_exclusive=[("prompts", "requests"), ("baseline_per_round", "baseline_tokens_per_second")],
        supports_check_mode=True,
    )
    params = module.params
    problem = validate(params)
    if problem:
        module.fail_json(msg=problem)
    base_url = params["base_url"].rstrip("/")
    api_key, timeout = params["api_key"], params["timeout_s"]
    items = distinct_requests(
        chat_requests(params["requests"], params["prompts"]), params["max_tokens"], params["temperature"]
    )
    per_round = min(params["num_prompts"], len(items))
    budget = min(max(per_round, params["max_prompts"] or per_round), len(items))
    sent_workload = workload(items, per_round)

    try:
        check_healthy(base_url, api_key=api_key, timeout=timeout)
        model = params["model"] or first_model(base_url, api_key, timeout)
        measured = Measurement(module, base_url, model)
        measured.round(sent_workload)
    except (VllmApiError, SpecMetricsError) as exc:
        module.fail_json(msg=str(exc))

    def baseline():
        """The baseline over the rounds sent so far (the same requests), or the one figure given."""
        rounds = params["baseline_per_round"]
        if rounds is None:
            return params["baseline_tokens_per_second"]
        same = rounds[: len(measured.per_round)]
        return round(sum(r[0] for r in same) / sum(r[1] for r in same), 2)

    def figures():
        tokens_per_second, speedup = throughput(measured.completion_tokens, measured.elapsed, baseline())
        return {
            "base_url": base_url,
            "model": model,
            "concurrency": params["concurrency"],
            "max_tokens": params["max_tokens"],
            "temperature": params["temperature"],
            "requests": measured.sent,
            "distinct_requests": len(items),
            "errors": len(measured.errors),
            "first_error": str(measured.errors[0]) if measured.errors else None,
            "completion_tokens": measured.completion_tokens,
            "elapsed_s": round(measured.elapsed, 3),
            "tokens_per_second": tokens_per_second,
            "baseline_tokens_per_second": baseline(),
            "per_round": measured.per_round,
            "speedup": speedup,
            "workload_digest": workload_digest(sent_workload, params["max_tokens"], params["temperature"]),
        }

    facts = figures()
    if len(measured.errors) == measured.sent:
        first = measured.errors[0]
        if isinstance(first, AuthFailed):
            module.fail_json(msg=str(first), ansible_facts={"speculation_gate": facts})
        module.fail_json(
            msg=f"all {measured.sent} chat requests failed; first error: {first}",
            ansible_facts={"speculation_gate": facts},
        )

    if not params["speculation"]:
        # The whole budget, so that a speculative run compares the same requests after any round.
        try:
            while measured.sent < budget:
                more = workload(items, min(per_round, budget - measured.sent), start=measured.sent)
                measured.round(more)
                sent_workload += more
        except (VllmApiError, SpecMetricsError) as exc:
            module.fail_json(msg=str(exc), ansible_facts={"speculation_gate": facts})
        facts = figures()
        reason = f"baseline without speculation: {facts['tokens_per_second']} tok/s"
        line = (
            f"{facts['tokens_per_second']:.1f} tok/s without speculation, {measured.sent} distinct requests"
        )
        facts.update(passed=True, reason=reason, summary=line)
        module.exit_json(changed=False, passed=True, reason=reason, ansible_facts={"speculation_gate": facts})

    try:
        thresholds = floors(params, measured.k)
    except ValueError as exc:
        module.fail_json(msg=str(exc), ansible_facts={"speculation_gate": facts})
    facts.update(k=measured.k, floors=thresholds)
    if any(option.endswith(VS_BEST) and limit is not None for option, limit in thresholds.items()):
        facts.update(best=params["best"], max_regression=params["max_regression"])
    rounds = 1
    while True:
        try:
            facts.update(measured.window())
        except (VllmApiError, SpecMetricsError) as exc:
            module.fail_json(msg=str(exc), ansible_facts={"speculation_gate": facts})
        if facts["draft_lengths"]:
            # The floors at the lengths the server drafted (a schedule's mix), once the responses say them.
            try:
                thresholds = floors(
                    params, measured.k, {row["k"]: row["drafts"] for row in facts["draft_lengths"]}
                )
            except ValueError as exc:
                module.fail_json(msg=str(exc), ansible_facts={"speculation_gate": facts})
            facts["floors"] = thresholds
        if not facts["num_draft_tokens"]:
            module.fail_json(
                msg=(
                    f"no draft tokens in the window: {measured.sent - len(measured.errors)} request(s) "
                    f"produced {measured.completion_tokens} completion tokens but {base_url} drafted none"
                ),
                ansible_facts={"speculation_gate": facts},
            )
        misdrafted = drafted_as_configured(facts, measured.k, params)
        if misdrafted:
            module.fail_json(msg=misdrafted, ansible_facts={"speculation_gate": facts})
        verdicts = judge(facts, thresholds, params["point_figure"])
        # More requests help an interval that straddles, or one still missing for want of requests.
        more_helps = {"straddles"} | ({NO_INTERVAL} if facts["per_request_source"] else set())
        undecided = bool(more_helps & set(verdicts.values())) and "below" not in verdicts.values()
        if not undecided or measured.sent >= budget or measured.elapsed >= params["max_time_s"]:
            break
        more = workload(items, min(per_round, budget - measured.sent), start=measured.sent)
        try:
            measured.round(more)
        except (VllmApiError, SpecMetricsError) as exc:
            module.fail_json(msg=str(exc), ansible_facts={"speculation_gate": facts})
        sent_workload += more
        rounds += 1
        facts.update(figures())

    facts.update(verdicts=verdicts, rounds=rounds)
    passed, reason = evaluate(facts, thresholds, verdicts)
    facts.update(passed=passed, reason=reason, summary=summary(facts))
    result = dict(changed=False, passed=passed, reason=reason, ansible_facts={"speculation_gate": facts})
    if not passed:
        module.fail_json(msg=reason, **result)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
