"""The gate driven as a user would: the converged server under load, the operator's own traffic as the
workload, the 15% drafter with an impossible speedup rolled back with the rollout stopped before a
second box, a plain deploy passing again; checked on structured results. testinfra (tests/) then
checks the box and reports."""

import hashlib
import json
import re
import time

from driver import ROOT
from last_good_checks import assert_restored
from sim_box_client import theory
from tokenizers import Tokenizer

MODELS = ROOT / "build/sim-models"
SMOKE = "vllm_spec_smoke"
# vLLM logs "SpecDecoding metrics: ... Accepted: N tokens, Drafted: M tokens" every 10 s for the
# traffic of that interval: after a quiet interval, the lines that follow cover exactly the load's
# window, an account independent of /metrics.
METRICS_LOG_INTERVAL_S = 12


def load_matches_vllms_own_log(scenario):
    box, host = scenario.box, scenario.host
    time.sleep(METRICS_LOG_INTERVAL_S)
    cursor = box.out("journalctl --unit vllm --show-cursor --lines 0 --quiet").strip()
    cursor = cursor.removeprefix("-- cursor: ")
    load = scenario.play("molecule/gate/load.yml")
    assert load.ok, str(load)
    smoke = load.one(host=host, action=SMOKE).facts["vllm_spec_smoke"]
    assert smoke["requests"] == 16 and smoke["errors"] == 0, smoke
    # Batched 8 at a time, every request still walks exactly as the theory says (greedy is exact).
    expected = theory("eagle3-known-3.4")["expected"]
    assert smoke["num_drafts"] == 2 * expected["num_drafts"], smoke
    assert smoke["acceptance_rate"] == expected["acceptance_rate"], smoke
    assert smoke["intervals"]["method"] == "per draft", smoke  # no per-request counts under load
    time.sleep(METRICS_LOG_INTERVAL_S)
    log = box.out(f"journalctl --unit vllm --no-pager --output cat --after-cursor '{cursor}'")
    accepted = sum(int(n) for n in re.findall(r"Accepted: (\d+) tokens", log))
    drafted = sum(int(n) for n in re.findall(r"Drafted: (\d+) tokens", log))
    assert smoke["num_draft_tokens"] > 0, smoke
    assert (accepted, drafted) == (smoke["num_accepted_tokens"], smoke["num_draft_tokens"]), (smoke, log)


def operators_traffic(scenario):
    """A JSONL file of chat requests whose prompts end on 8 different tokens of the token map's cycle
    (an assistant message continued), as an operator's exported traffic would differ from request to
    request; the theory gives each one's mean acceptance length."""
    known = theory("eagle3-known-3.4")
    tokenizer = Tokenizer.from_file(str(MODELS / "tokenmap" / "tokenizer.json"))
    tokens = known["cycle_token_ids"][::15][:8]
    requests = [
        {
            "messages": [
                {"role": "user", "content": "Go on."},
                {"role": "assistant", "content": tokenizer.decode([token])},
            ],
            "continue_final_message": True,
            "add_generation_prompt": False,
        }
        for token in tokens
    ]
    path = scenario.workdir / "traffic.jsonl"
    path.write_text("".join(json.dumps(request) + "\n" for request in requests))
    by_token = known["any_prompt"]["mean_acceptance_length_by_last_cycle_token"]
    return path, [by_token[str(token)] for token in tokens]


def gate_on_the_operators_traffic(scenario):
    host = scenario.host
    path, expected = operators_traffic(scenario)
    run = scenario.play("deploy.yml", "--tags", "gate", "-e", f"gate_workload_file={path}")
    assert run.ok, str(run)
    smoke = run.one(host=host, role="gate", file="gate/tasks/main.yml", action=SMOKE).facts["vllm_spec_smoke"]
    assert smoke["requests"] == 8 and smoke["rounds"] == 1, smoke
    # Each request of the file, measured on its own, gives its known acceptance.
    assert [1 + accepted / drafts for drafts, accepted in smoke["per_request"]] == expected, smoke
    assert smoke["intervals"]["method"] == "per request", smoke
    report = json.loads((ROOT / "reports" / f"{host}.json").read_text())
    assert report["workload"]["file"] == str(path), report["workload"]
    assert report["workload"]["file_sha256"] == hashlib.sha256(path.read_bytes()).hexdigest()
    assert report["workload"]["digest"] == smoke["workload_digest"]


def side_effect(scenario):
    host = scenario.host
    load_matches_vllms_own_log(scenario)
    gate_on_the_operators_traffic(scenario)

    # The 15% drafter (mean acceptance length 1.41 on the gate's prompts) to the fleet, with an
    # impossible speedup asked for: a real baseline is measured without speculation; the acceptance
    # interval lies under the floors, so the gate fails at once on all three; the box's last known
    # good (recorded when converge passed the gate) is restored, the line says why with the intervals
    # and what this run had changed, and the rollout stops before the second box. (One story: every
    # server restart costs a minute of the suite's two cores.)
    good = scenario.box.out("readlink /srv/drafters/current").strip()
    random = scenario.play(
        "deploy.yml",
        "--tags",
        "eagle3",
        "-e",
        f"eagle3_drafter_source={MODELS / 'eagle3-known-1.4'}",
        "-e",
        "gate_min_speedup=1000",
        inventory=scenario.second_box_inventory,
    )
    assert not random.ok, str(random)
    assert random.ran(host=host, role="gate", file="gate/tasks/baseline.yml", action=SMOKE), str(random)
    failure = " ".join(random.failures(host))
    assert re.search(
        rf"gate failed on {host}: acceptance_rate 0\.14 \[0\.1\d, 0\.1\d\] < min_acceptance_rate 0\.40; "
        r"mean_acceptance_length 1\.41 \[1\.\d\d, 1\.\d\d\] < min_mean_acceptance_length 2\.20; "
        r"speedup [0-9.]+ < min_speedup 1000\.00",
        failure,
    ), failure
    low = random.one(host=host, role="gate", file="gate/tasks/main.yml", action=SMOKE)
    assert low.facts["vllm_spec_smoke"]["rounds"] == 1, str(random)  # clearly below: no second round
    # The record puts `current` back (the gate's own rollback is for boxes without one).
    line = assert_restored(random, scenario.box, host, [f"drafter link -> {good}"])
    assert line.startswith(f"gate failed on {host}: "), line
    assert f"(this run had changed: drafter link -> {good})" in line, line
    assert not random.ran(host=host, role="gate", file="gate/tasks/rollback.yml"), str(random)
    assert scenario.box.out("readlink /srv/drafters/current").strip() == good

    # The 3.0 drafter clears both floors, but falls more than 10% (gate_max_regression) under the best
    # mean acceptance length recorded on this box for the gate's workload (3.37, at converge): failed
    # and restored all the same.
    regressing = scenario.play(
        "deploy.yml",
        "--tags",
        "eagle3",
        "-e",
        f"eagle3_drafter_source={MODELS / 'eagle3-known-3.0'}",
        inventory=scenario.second_box_inventory,
    )
    line = assert_restored(regressing, scenario.box, host, [f"drafter link -> {good}"])
    best = theory("eagle3-known-3.4")["expected"]["mean_acceptance_length"]
    assert re.match(
        rf"gate failed on {host}: mean_acceptance_length 3\.00 \[3\.00, 3\.00\] < "
        rf"min_mean_acceptance_length_vs_best 3\.03 \(10% under the best {best:.2f} of 20\S+\); "
        r"restored the last known good of ",
        line,
    ), line
    smoke = regressing.one(host=host, role="gate", file="gate/tasks/main.yml", action=SMOKE)
    assert smoke.facts["vllm_spec_smoke"]["verdicts"]["min_mean_acceptance_length"] == "above", str(
        regressing
    )

    # The inventory's own settings again: the box passes the gate on the release it was rolled back
    # to, which already serves (no restart).
    restore = scenario.play("deploy.yml")
    assert restore.ok, str(restore)
    assert not restore.changed_results(host=host, role="vllm_service", action="systemd_service"), str(restore)
    assert not restore.changed_results(host=host, role="last_good"), str(restore)  # the same last good
    smoke = restore.one(host=host, role="gate", file="gate/tasks/main.yml", action=SMOKE)
    metrics = smoke.facts["vllm_spec_smoke"]
    expected = theory("eagle3-known-3.4")["expected"]
    assert metrics["num_accepted_tokens_per_pos"] == expected["num_accepted_tokens_per_pos"], metrics
    assert metrics["mean_acceptance_length"] == expected["mean_acceptance_length"], metrics
