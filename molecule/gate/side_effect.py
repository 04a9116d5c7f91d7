"""The gate driven as a user would: the converged server under load, the random drafter rolled back
with the rollout stopped before a second box, an impossible speedup, a plain deploy restoring a
passing state; checked on structured results. testinfra (tests/) then checks the box and reports."""

import json
import re
import time

from driver import ROOT

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
    assert smoke["acceptance_rate"] == 1.0, smoke
    time.sleep(METRICS_LOG_INTERVAL_S)
    log = box.out(f"journalctl --unit vllm --no-pager --output cat --after-cursor '{cursor}'")
    accepted = sum(int(n) for n in re.findall(r"Accepted: (\d+) tokens", log))
    drafted = sum(int(n) for n in re.findall(r"Drafted: (\d+) tokens", log))
    assert smoke["num_draft_tokens"] > 0, smoke
    assert (accepted, drafted) == (smoke["num_accepted_tokens"], smoke["num_draft_tokens"]), (smoke, log)


def second_box_inventory(scenario):
    """A second box later in the rollout; it must never be reached once the first box fails."""
    path = scenario.workdir / "second-box.yml"
    path.write_text(
        json.dumps(
            {
                "all": {
                    "children": {
                        "gpu_boxes": {
                            "hosts": {
                                "zz-second-box": {
                                    "ansible_connection": "containers.podman.podman",
                                    "ansible_host": "specfleet-gate-second-box-never-created",
                                }
                            }
                        }
                    }
                }
            }
        )
    )
    return path


def side_effect(scenario):
    host = scenario.host
    load_matches_vllms_own_log(scenario)

    # The random drafter (acceptance 0) to the fleet: the gate fails, rolls back, says why in one
    # line, and the rollout stops before the second box.
    random = scenario.play(
        "deploy.yml",
        "--tags",
        "eagle3",
        "-e",
        f"eagle3_drafter_source={MODELS / 'eagle3-random'}",
        inventory=second_box_inventory(scenario),
    )
    assert not random.ok, str(random)
    failure = " ".join(random.failures(host))
    assert re.search(rf"gate failed on {host}: acceptance_rate 0.00 < min_acceptance_rate 0.40", failure), (
        failure
    )
    assert re.search(r"rolled back from drafter release \w+ to \w+, which now serves", failure), failure
    # eagle3_drafter's rollback entry point moves `current` back; the gate restarts on it.
    relink = random.one(
        host=host, role="eagle3_drafter", file="eagle3_drafter/tasks/rollback.yml", action="file"
    )
    assert relink.changed, str(random)
    rollback_restart = random.one(
        host=host, role="gate", file="gate/tasks/rollback.yml", action="systemd_service"
    )
    assert rollback_restart.changed, str(random)
    assert random.results.index(relink) < random.results.index(rollback_restart), str(random)
    completions = random.ran(
        host=host, role="vllm_service", file="vllm_service/tasks/ready.yml", action="uri"
    )
    assert random.results.index(completions[-1]) > random.results.index(rollback_restart), (
        f"no completion confirmed the previous release after the rollback\n{random}"
    )
    assert "zz-second-box" not in random.hosts(), str(random)

    # An impossible speedup: a real baseline is measured without speculation, then the gate fails on it.
    speedup = scenario.play("deploy.yml", "--tags", "eagle3", "-e", "gate_min_speedup=1000")
    assert not speedup.ok, str(speedup)
    assert speedup.ran(host=host, role="gate", file="gate/tasks/baseline.yml", action=SMOKE), str(speedup)
    failure = " ".join(speedup.failures(host))
    assert re.search(rf"gate failed on {host}: speedup [0-9.]+ < min_speedup 1000.00", failure), failure

    # The inventory's own settings again: the box passes the gate.
    restore = scenario.play("deploy.yml")
    assert restore.ok, str(restore)
    smoke = restore.one(host=host, role="gate", file="gate/tasks/main.yml", action=SMOKE)
    metrics = smoke.facts["vllm_spec_smoke"]
    assert (metrics["acceptance_rate"], metrics["mean_acceptance_length"]) == (1.0, 4.0), metrics
