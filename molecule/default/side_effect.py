"""The user's own `--tags nccl_tune` command lines against the converged box, checked on their
structured results; testinfra (tests/) then checks the box itself."""

DRIVER_FILE = "/usr/local/share/sim-nvidia-smi/driver-version"
TUNE = ("--tags", "nccl_tune")


def nccl_choice(run, host):
    """The NCCL facts of the run's measuring (not check-mode) nccl_tune call, else of the kept read."""
    calls = run.ran(host=host, role="nccl_tune", action="nccl_tune")
    return calls[-1].facts["nccl_tune"]


def unit_environment(scenario):
    return scenario.box.out("systemctl show vllm --property=Environment --value")


def side_effect(scenario):
    host = scenario.host

    before = unit_environment(scenario)
    assert "NCCL_PROTO=LL" in before and "NCCL_P2P_LEVEL=SYS" in before, before

    # While the server runs, a measurement would share the GPUs with it: refused in one line.
    busy = scenario.play("deploy.yml", *TUNE)
    assert not busy.ok, str(busy)
    assert any(
        f"NCCL measurement on {host} failed: vllm.service is running and would share the GPUs" in message
        and "nccl_tune_stop_service=true does); the service environment is unchanged" in message
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
    assert measured.ran(host=host, role="vllm_service", file="vllm_service/tasks/ready.yml", action="uri")
    assert measured.changed(host) > 0, str(measured)
    # Nothing else of the deploy ran: no install, no new drafter, no gate; the drafter role only
    # hands over the speculative config it serves (on every run, so that the unit keeps it).
    others = [
        result
        for result in measured.ran(host=host)
        if result.role in ("vllm", "eagle3_drafter", "gate")
        and result.action != "ansible.builtin.validate_argument_spec"
        and not (result.role == "eagle3_drafter" and result.action == "ansible.builtin.set_fact")
    ]
    assert not others, [(r.role, r.file, r.action) for r in others]

    again = scenario.play("deploy.yml", *TUNE)
    assert again.ok and again.changed(host) == 0, str(again)
    assert nccl_choice(again, host)["source"] == "kept", str(again)

    # Another driver on the simulated GPUs: a measurement is due again; check mode runs none.
    scenario.box.write(DRIVER_FILE, "580.95.05\n")
    new_driver = scenario.play("deploy.yml", *TUNE, "--check")
    assert new_driver.ok and new_driver.changed(host) > 0, str(new_driver)
    due = new_driver.one(host=host, role="nccl_tune", file="nccl_tune/tasks/measure.yml", action="nccl_tune")
    assert due.changed and due.result["measurement_due"], due.result
    assert "would measure: driver 575.57.08 -> 580.95.05" in due.facts["nccl_tune"]["reason"], due.result
    assert scenario.box.out(f"cat {DRIVER_FILE}") == "580.95.05\n"
    scenario.box.write(DRIVER_FILE, "575.57.08\n")

    # A plain deploy keeps the measured environment: nothing changes.
    deploy = scenario.play("deploy.yml")
    assert deploy.ok and deploy.changed(host) == 0, str(deploy)
