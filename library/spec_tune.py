#!/usr/bin/python
"""Ansible module: choose the speculation settings (k, or a batch-size schedule of k) by measuring the box's
own server."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: spec_tune
short_description: Measure a vLLM server's speed per speculative k and concurrency, and choose k
description:
  - "One module, three steps, driven by roles/spec_tune, which serves the target once per k (k = 0:
    speculation off) on a trial unit between them."
  - "C(step=measure): streams the workload to the server at O(base_url), which serves with O(k) speculative
    tokens, at each of O(concurrencies) in O(rounds) rounds of one request per concurrent client, after one
    warm-up request (never more than the workload's distinct requests, identical ones being one, so none
    repeats in a cell; round r sends the same requests at every k), and returns one row per concurrency:
    output tokens per second over the cell and in each round, median inter-token latency
    (a request's first-to-last token time over its tokens after the first) and, for k > 0, the acceptance
    counted on C(/metrics) meanwhile. Fails when a request fails or when the server drafts another number of
    tokens than O(k)."
  - "C(step=record): chooses from O(rows) (module_utils/spec_schedule.py): a k's gain over speculation off is
    the mean of log(speed at k / speed off) over the paired rounds, with its Student's t interval at
    O(confidence); per concurrency, ascending, the fastest k whose interval's low end is at least 1 +
    O(min_gain) (one round shows nothing) and no larger than the k chosen below it, else 0; as vLLM's
    C(num_speculative_tokens_per_batch_size) schedule
    (O(output=schedule), vLLM >= 0.24), or one k for the concurrency profile O(profile) (O(output=single)).
    Speculation is turned off when no k pays at concurrency 1. Keeps the table in O(cache_path) with its
    identity (drafter release, vLLM version, GPUs, driver, workload digest, server arguments, what was
    measured) and the date."
  - "C(step=read): the kept table, re-scored with today's O(output), O(min_gain), O(confidence), O(profile)
    and O(max_num_seqs) (new weights need no new measurement); when its identity no longer matches the box
    (another drafter release, vLLM, driver, GPUs or workload), nothing is chosen, C(measurement_due) is
    true and the untuned O(speculative_config) stands. Reads files and nvidia-smi only."
  - "Every step returns C(speculative_config): O(speculative_config) with the chosen C(num_speculative_tokens)
    and schedule, C({}) when speculation does not pay, or O(speculative_config) unchanged without a valid
    choice."
options:
  step:
    description: C(read) the kept choice, C(measure) the server at one k, or C(record) a table of rows.
    type: str
    choices: [read, measure, record]
    default: read
  speculative_config:
    description: The untuned speculative config (roles/eagle3_drafter's); its C(model) is the drafter release.
    type: dict
    required: true
  identity:
    description: What else the measurement depends on, from the role (vLLM version, model, server arguments).
    type: dict
    default: {}
  cache_path:
    description: Where the table is kept on the box.
    type: path
    default: /var/lib/specfleet/spec_tune.json
  output:
    description: C(schedule) writes vLLM's per-batch-size schedule; C(single) one k for every batch size.
    type: str
    choices: [schedule, single]
    default: schedule
  max_num_seqs:
    description: The server's largest batch; the schedule's last range ends there.
    type: int
    default: 256
  min_gain:
    description: >-
      How much faster than speculation off a k must be shown to be, at the low end of its interval, to be
      chosen (0.05 = 5%; -1 takes the fastest k whatever its interval).
    type: float
    default: 0.05
  confidence:
    description: Confidence of each k's gain interval over the rounds.
    type: float
    default: 0.95
  profile:
    description: >-
      For O(output=single), weights of the measured concurrencies, e.g. C({1: 0.6, 4: 0.4}); C({}) weighs
      all alike.
    type: dict
    default: {}
  floors_by_k:
    description: >-
      The gate's floors at each k, C({"1": {"mean_acceptance_length": 1.61}, ...}), as roles/served computes
      them once per box (C(served_floors.by_k)): a k whose measured mean acceptance length at a concurrency
      is below its floor is not chosen there, so the gate never fails what the tuner chose. It must cover
      k = 1..O(max_k); without a C(mean_acceptance_length) floor every k is a candidate.
    type: dict
    default: {}
  remeasure:
    description: Report a measurement as due although the kept table still matches.
    type: bool
    default: false
  nvidia_smi:
    description: nvidia-smi binary (GPU names and driver for the identity).
    type: str
    default: nvidia-smi
  base_url:
    description: Root URL of the server measured (C(step=measure)).
    type: str
    default: http://127.0.0.1:8000
  api_key:
    description: API key of the server.
    type: str
  model:
    description: Served model name.
    type: str
  k:
    description: Speculative tokens the server serves with now (C(step=measure)); 0 = speculation off.
    type: int
    default: 0
  max_k:
    description: The largest k measured; k = 0 to max_k make the table.
    type: int
    default: 3
  concurrencies:
    description: Concurrent requests measured, ascending, starting at 1.
    type: list
    elements: int
    default: [1, 2, 4, 8]
  rounds:
    description: >-
      Rounds per cell, each one request per concurrent client (a cell sends at most the distinct requests:
      fewer rounds where they run out).
    type: int
    default: 3
  requests:
    description: The workload as chat request bodies (the gate's workload file), else the built-in prompts.
    type: list
    elements: dict
  max_tokens:
    description: Completion tokens per request (a request's own max_tokens wins).
    type: int
    default: 64
  timeout_s:
    description: Seconds per request. Was timeout (still taken).
    aliases: [timeout]
    type: int
    default: 300
  rows:
    description: The rows of every C(step=measure), for C(step=record).
    type: list
    elements: dict
  started_at:
    description: Epoch seconds when the measurement began (the first trial start), for its stated cost.
    type: float
  speculation_off:
    description:
      - The rows without speculation (k = 0) that an earlier trial without speculation measured with this
        module (C(rows) and C(speculation_off_identity) of its C(step=measure) at k = 0, and C(measured_at)),
        as roles/measurement keeps them beside the gate's baseline. Where their identity is this
        measurement's (vLLM, model, server arguments, GPUs, driver, workload, concurrencies, rounds,
        max_tokens) and O(remeasure) is false, C(step=read) leaves k = 0 out of C(trial_ks) and
        C(step=record) takes them as the table's k = 0, one server start fewer.
    type: dict
extends_documentation_fragment:
  - action_common_attributes
  - action_common_attributes.facts
attributes:
  check_mode:
    support: full
    details: >-
      C(read) and C(measure) change nothing; C(record) in check mode reports the choice without keeping it.
  diff_mode:
    support: none
  facts:
    support: full
  platform:
    platforms: posix
notes:
  - C(step=measure) sends requests to the server measured; run it on a trial server, not one that serves
    traffic (roles/spec_tune takes the box out of service first, or refuses).
author:
  - specfleet maintainers
"""

EXAMPLES = r"""
- name: Read the kept choice (every run)
  spec_tune:
    speculative_config: "{{ eagle3_drafter_speculative_config }}"
    identity: {vllm_version: "0.33.0"}

- name: Measure the trial server at k=2
  spec_tune:
    step: measure
    speculative_config: "{{ eagle3_drafter_speculative_config }}"
    k: 2
    concurrencies: [1, 2, 4, 8, 16]
    api_key: "{{ vllm_service_api_key }}"
    model: kimi-k2.5
  register: trial

- name: Choose and keep
  spec_tune:
    step: record
    speculative_config: "{{ eagle3_drafter_speculative_config }}"
    rows: "{{ all_rows }}"
    max_num_seqs: 256
"""

RETURN = r"""
measurement_due:
  description: No kept table matches the box (or O(remeasure)); C(step=read) only.
  type: bool
  returned: always
speculation_off_identity:
  description: C(step=measure) at k = 0 only (else null); what those rows depend on, for O(speculation_off).
  type: dict
  returned: when step is measure
rows:
  description: C(step=measure) only; one row per concurrency.
  type: list
  elements: dict
  returned: when step is measure
  sample: [{"k": 2, "concurrency": 1, "requests": 3, "completion_tokens": 192, "seconds": 1.9,
            "tokens_per_second": 101.0, "inter_token_latency_ms": 9.6, "mean_acceptance_length": 2.68,
            "per_position_acceptance": [0.89, 0.79], "draft_tokens_per_draft": 2.0, "errors": []}]
ansible_facts:
  description: C(spec_tune), for roles/vllm_service and the gate.
  returned: always
  type: complex
  contains:
    spec_tune:
      description: The choice and what it rests on.
      type: complex
      contains:
        source:
          description: C(measured) (this run), C(kept) (an earlier run's table, still valid) or C(none).
          type: str
        speculative_config:
          description: What the server should serve; C({}) turns speculation off.
          type: dict
        choice:
          description: >-
            C(speculation), C(num_speculative_tokens), C(schedule) (or null), C(per_concurrency)
            ({concurrency: {k, gain}}), C(reason); null without a valid table.
          type: dict
        table:
          description: Every measured row (the kept table).
          type: list
        predicted:
          description: >-
            Per k, the mean acceptance length predicted from the per-position acceptance at the largest k
            (greedy drafting proposes the same first tokens) beside the one measured at k, at concurrency 1.
          type: list
        identity:
          description: What the table was measured on.
          type: dict
        stale:
          description: The identity fields that changed since the kept table (C(step=read)).
          type: list
        trial_ks:
          description: >-
            The k each trial of a measurement serves (C(step=read)): 0..O(max_k), or 1..O(max_k) where
            O(speculation_off) gives k = 0.
          type: list
        measured_at:
          description: When the kept table was measured (UTC).
          type: str
        cost:
          description: Server starts and seconds the measurement took.
          type: dict
        reason:
          description: One line.
          type: str
"""

import datetime
import os
import statistics
import time

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.chat_load import (
    chat_requests,
    distinct_requests,
    load_cell,
    workload,
    workload_digest,
)
from ansible.module_utils.kept_measurement import KeptMeasurementError, changed_fields, read_kept, write_kept
from ansible.module_utils.spec_metrics import SpecMetricsError, scrape, spec_series, window_metrics
from ansible.module_utils.spec_schedule import (
    SCHEDULE_KEY,
    ScheduleError,
    choose,
    gate_floor,
    predicted_mean_length,
)
from ansible.module_utils.vllm_api import VllmApiError, check_healthy

# Identity fields too long to show old -> new.
SUMMARIZED = ("workload", "server")


class TuneError(Exception):
    """The step cannot be done; str() is the one-line reason."""


def plan(params):
    """What the measurement consists of: it is part of the identity."""
    return {
        "ks": list(range(params["max_k"] + 1)),
        "concurrencies": params["concurrencies"],
        "rounds": params["rounds"],
        "max_tokens": params["max_tokens"],
    }


def gpus_and_driver(module):
    """GPU names and driver; ([], "unknown") before a driver is installed (a bare box in check mode)."""
    binary = module.get_bin_path(module.params["nvidia_smi"])
    rc, out, _err = (
        module.run_command([binary, "--query-gpu=name,driver_version", "--format=csv,noheader"])
        if binary
        else (1, "", "")
    )
    if rc != 0:
        return [], "unknown"
    rows = [[value.strip() for value in line.split(",")] for line in out.splitlines() if line.strip()]
    return [row[0] for row in rows], ",".join(sorted({row[-1] for row in rows}))


def workload_requests(params):
    """The workload's distinct requests (identical ones are one), in order: what a cell sends from."""
    return distinct_requests(chat_requests(params["requests"]), params["max_tokens"], 0.0)


def speculation_off_identity(module):
    """What the rows without speculation depend on: the table's identity but the drafter and k."""
    params = module.params
    gpus, driver = gpus_and_driver(module)
    return {
        **params["identity"],
        "gpus": gpus,
        "driver": driver,
        "workload": workload_digest(workload_requests(params), params["max_tokens"], 0.0),
        "plan": {key: value for key, value in plan(params).items() if key != "ks"},
    }


def identity(module):
    params = module.params
    base = {key: value for key, value in params["speculative_config"].items() if key != SCHEDULE_KEY}
    return {
        **speculation_off_identity(module),
        "drafter_release": os.path.basename(os.path.realpath(base.get("model", ""))),
        "speculative_config": {k: v for k, v in base.items() if k not in ("model", "num_speculative_tokens")},
        "plan": plan(params),
    }


def reusable_speculation_off(module):
    """The rows without speculation from an earlier trial without speculation (O(speculation_off)) where they
    still match the box and this measurement, else None; without them, k = 0 is a trial of its own."""
    given = module.params["speculation_off"]
    if not given or module.params["remeasure"]:
        return None
    if given.get("identity") != speculation_off_identity(module) or not given.get("rows"):
        return None
    return given


def trial_ks(module):
    """The k each trial serves: 1..max_k where the rows without speculation are reused, else 0..max_k."""
    ks = plan(module.params)["ks"]
    return ks[1:] if reusable_speculation_off(module) else ks


def tuned_config(base, choice):
    """The speculative config the server should serve under `choice` (None: no valid choice)."""
    if not choice:
        return base
    if not choice["speculation"]:
        return {}
    config = {key: value for key, value in base.items() if key != SCHEDULE_KEY}
    config["num_speculative_tokens"] = choice["num_speculative_tokens"]
    if choice["schedule"]:
        config[SCHEDULE_KEY] = choice["schedule"]
    return config


def predictions(rows):
    """Mean acceptance length per k at concurrency 1: predicted from the largest k, and measured."""
    lowest = min(row["concurrency"] for row in rows)
    at_one = {row["k"]: row for row in rows if row["concurrency"] == lowest}
    largest = max(at_one)
    if largest == 0 or not at_one[largest].get("per_position_acceptance"):
        return []
    curve = at_one[largest]["per_position_acceptance"]
    return [
        {
            "k": k,
            "predicted_mean_acceptance_length": round(predicted_mean_length(curve, k), 4),
            "measured_mean_acceptance_length": at_one[k].get("mean_acceptance_length"),
        }
        for k in sorted(at_one)
        if 0 < k <= len(curve)
    ]


def scoring(params):
    return {
        "output": params["output"],
        "min_gain": params["min_gain"],
        "confidence": params["confidence"],
        "profile": params["profile"],
        "max_num_seqs": params["max_num_seqs"],
        "floors_by_k": {str(k): floor for k, floor in sorted(floors_by_k(params).items())},
    }


def floors_by_k(params):
    """{k: mean acceptance length floor} of the gate's floors, {} where it has none."""
    return {
        int(k): float(at_k["mean_acceptance_length"])
        for k, at_k in params["floors_by_k"].items()
        if at_k.get("mean_acceptance_length")
    }


def choice_of(rows, params):
    eligible = gate_floor(floors_by_k(params))
    return choose(
        rows,
        params["output"],
        params["max_num_seqs"],
        params["min_gain"],
        params["profile"],
        eligible,
        params["confidence"],
    )


def facts(source, base, choice, kept, **more):
    return {
        "source": source,
        "speculative_config": tuned_config(base, choice),
        "choice": choice,
        "table": kept["rows"] if kept else [],
        "predicted": predictions(kept["rows"]) if kept else [],
        "identity": kept["identity"] if kept else None,
        "measured_at": kept["measured_at"] if kept else None,
        "cost": kept.get("cost") if kept else None,
        **more,
    }


def read(module):
    """(changed, measurement due, facts); the facts' C(trial_ks) name the trials a measurement serves."""
    params = module.params
    base = params["speculative_config"]
    kept = read_kept(params["cache_path"])
    current = identity(module)
    stale = changed_fields(kept["identity"], current, SUMMARIZED) if kept else ["nothing measured yet"]
    ks = trial_ks(module)
    if stale:
        why = "; ".join(stale)
        return (
            False,
            True,
            facts("none", base, None, None, stale=stale if kept else [], reason=why, trial_ks=ks),
        )
    choice = choice_of(kept["rows"], params)
    rescored = kept.get("scoring") != scoring(params)
    if rescored and not module.check_mode:
        write_kept(module, params["cache_path"], dict(kept, scoring=scoring(params), choice=choice))
    return (
        rescored,
        params["remeasure"],
        facts("kept", base, choice, kept, stale=[], reason=choice["reason"], trial_ks=ks),
    )


def merge_rounds(cells):
    """One row of a cell's rounds: tokens per second over them all and in each, the median inter-token
    latency of their requests (the rounds' medians' median), their errors."""
    tokens = sum(cell["completion_tokens"] for cell in cells)
    seconds = sum(cell["seconds"] for cell in cells)
    latencies = [
        cell["inter_token_latency_ms"] for cell in cells if cell["inter_token_latency_ms"] is not None
    ]
    return {
        **cells[0],
        "requests": sum(cell["requests"] for cell in cells),
        "completion_tokens": tokens,
        "seconds": round(seconds, 4),
        "tokens_per_second": round(tokens / seconds, 2) if seconds > 0 else 0.0,
        "rounds_tokens_per_second": [cell["tokens_per_second"] for cell in cells],
        "inter_token_latency_ms": round(statistics.median(latencies), 3) if latencies else None,
        "errors": [error for cell in cells for error in cell["errors"]],
    }


def measure(module):
    """The rows of the server as it serves now, at k speculative tokens."""
    params = module.params
    url, key, k = params["base_url"].rstrip("/"), params["api_key"], params["k"]
    timeout = params["timeout_s"]
    check_healthy(url, api_key=key, timeout=timeout)
    chat = url + "/v1/chat/completions"
    requests = workload_requests(params)
    # The first request after a start pays for warm-up (allocations, caches): not part of any cell.
    load_cell(chat, key, params["model"], requests[:1], params["max_tokens"], 1, timeout)
    rows, start = [], 0
    for concurrency in params["concurrencies"]:
        sent = workload(requests, concurrency * params["rounds"], start)
        start += len(sent)
        before = spec_series(scrape(url, key, timeout).samples, params["model"], url) if k else None
        # One request per client a round, the same requests in round r at every k: the gain is paired.
        rounds = [sent[i : i + concurrency] for i in range(0, len(sent) - concurrency + 1, concurrency)] or [
            sent
        ]
        cells = [
            load_cell(chat, key, params["model"], part, params["max_tokens"], concurrency, timeout)
            for part in rounds
        ]
        row = merge_rounds(cells)
        if row["errors"]:
            failed = row["errors"]
            raise TuneError(
                f"at k={k}, concurrency {concurrency}: {len(failed)} requests failed: {failed[0]}"
            )
        row["k"] = k
        if k:
            window = window_metrics(
                before, spec_series(scrape(url, key, timeout).samples, params["model"], url)
            )
            drafted = window["num_draft_tokens"] / window["num_drafts"] if window["num_drafts"] else None
            if drafted is not None and round(drafted, 6) != k:
                raise TuneError(
                    f"the trial server drafts {drafted:g} tokens per draft at concurrency {concurrency},"
                    f" not k={k}"
                )
            row.update(
                mean_acceptance_length=window["mean_acceptance_length"],
                per_position_acceptance=window["per_position_acceptance"][:k],
                draft_tokens_per_draft=drafted,
            )
        del row["errors"]
        rows.append(row)
    return rows


def record(module):
    params = module.params
    reused = reusable_speculation_off(module)
    rows = (reused["rows"] if reused else []) + (params["rows"] or [])
    measured = {(row.get("k"), row.get("concurrency")) for row in rows}
    wanted = {(k, c) for k in plan(params)["ks"] for c in params["concurrencies"]}
    if measured != wanted:
        missing = sorted(wanted - measured)
        raise TuneError(
            f"the table lacks k={missing[0][0]} at concurrency {missing[0][1]}"
            if missing
            else "the table has rows that are not in the plan"
        )
    choice = choice_of(rows, params)
    now = datetime.datetime.now(datetime.timezone.utc).replace(microsecond=0)
    cost = {
        "server_starts": len(trial_ks(module)),
        "seconds": round(time.time() - params["started_at"], 1) if params["started_at"] else None,
        # k = 0 from an earlier trial without speculation (its own start, counted there): when.
        "speculation_off_measured_at": reused.get("measured_at") if reused else None,
    }
    kept = {
        "measured_at": now.isoformat(),
        "identity": identity(module),
        "rows": rows,
        "cost": cost,
        "scoring": scoring(params),
        "choice": choice,
    }
    if not module.check_mode:
        write_kept(module, params["cache_path"], kept)
    return facts(
        "measured", params["speculative_config"], choice, kept, stale=[], reason=choice["reason"], trial_ks=[]
    )


def summary(spec_tune):
    """The table as lines: per concurrency, tokens/s and inter-token latency per k, each k's gain over
    speculation off with its interval, and the k chosen."""
    lines = []
    by_level = {}
    for row in spec_tune["table"]:
        by_level.setdefault(row["concurrency"], {})[row["k"]] = row
    for concurrency, by_k in sorted(by_level.items()):
        chosen = (spec_tune["choice"] or {}).get("per_concurrency", {}).get(concurrency, {})
        gains = chosen.get("gains", {})
        cells = []
        for k, row in sorted(by_k.items()):
            cell = f"k={k} {row['tokens_per_second']:.1f} tok/s {row['inter_token_latency_ms'] or 0:.1f} ms"
            gain = gains.get(k) or gains.get(str(k))
            if gain:
                low, high = gain[1], gain[2]
                cell += f" {gain[0]:.2f}x " + (
                    f"[{low:.2f}, {high:.2f}]" if high is not None else "(one round)"
                )
            cells.append(cell)
        lines.append(f"concurrency {concurrency}: {', '.join(cells)} -> k={chosen.get('k')}")
    return lines


ARGUMENT_SPEC = dict(
    step=dict(type="str", choices=["read", "measure", "record"], default="read"),
    speculative_config=dict(type="dict", required=True),
    identity=dict(type="dict", default={}),
    cache_path=dict(type="path", default="/var/lib/specfleet/spec_tune.json"),
    output=dict(type="str", choices=["schedule", "single"], default="schedule"),
    max_num_seqs=dict(type="int", default=256),
    min_gain=dict(type="float", default=0.05),
    confidence=dict(type="float", default=0.95),
    profile=dict(type="dict", default={}),
    floors_by_k=dict(type="dict", default={}),
    remeasure=dict(type="bool", default=False),
    nvidia_smi=dict(type="str", default="nvidia-smi"),
    base_url=dict(type="str", default="http://127.0.0.1:8000"),
    api_key=dict(type="str", no_log=True),
    model=dict(type="str"),
    k=dict(type="int", default=0),
    max_k=dict(type="int", default=3),
    concurrencies=dict(type="list", elements="int", default=[1, 2, 4, 8]),
    rounds=dict(type="int", default=3),
    requests=dict(type="list", elements="dict"),
    max_tokens=dict(type="int", default=64),
    timeout_s=dict(type="int", default=300, aliases=["timeout"]),
    rows=dict(type="list", elements="dict"),
    started_at=dict(type="float"),
    speculation_off=dict(type="dict"),
)


def validate(params):
    levels = params["concurrencies"]
    if not levels or levels[0] != 1 or levels != sorted(set(levels)):
        return f"concurrencies must be ascending and distinct, from 1: {levels}"
    if params["max_k"] < 1:
        return f"max_k must be at least 1, got {params['max_k']}"
    if not 0 <= params["k"] <= params["max_k"]:
        return f"k must be 0 to max_k {params['max_k']}, got {params['k']}"
    uncovered = [
        k
        for k in range(1, params["max_k"] + 1)
        if params["floors_by_k"] and str(k) not in params["floors_by_k"]
    ]
    if uncovered:
        return f"floors_by_k has no floors at k={', '.join(map(str, uncovered))} (max_k {params['max_k']})"
    if levels[-1] > params["max_num_seqs"]:
        return f"concurrency {levels[-1]} is above the server's max_num_seqs {params['max_num_seqs']}"
    if params["rounds"] < 1 or params["max_tokens"] < 1:
        return "rounds and max_tokens must be at least 1"
    if not 0 < params["confidence"] < 1:
        return f"confidence must be between 0 and 1, not {params['confidence']}"
    if not params["speculative_config"].get("model"):
        return "speculative_config has no model (the drafter)"
    return None


def main():
    module = AnsibleModule(argument_spec=ARGUMENT_SPEC, supports_check_mode=True)
    params = module.params
    problem = validate(params)
    if problem:
        module.fail_json(msg=problem)
    try:
        if params["step"] == "measure":
            rows = measure(module)
            # Without speculation, what the rows depend on: roles/measurement keeps them with it.
            off = speculation_off_identity(module) if params["k"] == 0 else None
            module.exit_json(changed=False, measurement_due=False, rows=rows, speculation_off_identity=off)
        if params["step"] == "record":
            changed, due, spec_tune = not module.check_mode, False, record(module)
        else:
            changed, due, spec_tune = read(module)
    except (TuneError, KeptMeasurementError, ScheduleError, SpecMetricsError, VllmApiError) as error:
        module.fail_json(msg=str(error))
    for line in spec_tune.get("stale") or []:
        module.warn(
            f"the kept speculation table is stale ({line}); re-measure with playbooks/tune_speculation.yml"
        )
    spec_tune["summary"] = summary(spec_tune)
    module.exit_json(changed=changed, measurement_due=due, ansible_facts={"spec_tune": spec_tune})


if __name__ == "__main__":
    main()
