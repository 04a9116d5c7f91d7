"""A box's first deploy whose gate fails: no last known good to go back to, so roles/transaction falls back
as transaction_first_deploy_fallback says (previous_drafter, the default): the drafter release served before,
else the target without speculation; either answers a completion, the lock is released and no record is
written (the next deploy is still a first one).

A box of its own from the installed image (vLLM installed, nothing served yet), reached over SSH.
"""

import json

import pytest
from driver import ROOT, SECOND_BOX, Box, podman, run_playbook, ssh_inventory

BOX = "specfleet-first-deploy"
HOST = "sim-gpu-box"
IMAGE = "localhost/specfleet-simbox:installed"
# The 15% drafter: mean acceptance length 1.4, under every floor.
LOW = ("-e", f"eagle3_drafter_source={ROOT / 'build/sim-models/eagle3-known-1.4'}")
UNIT = "/etc/systemd/system/vllm.service"
# Light on the controller between its two server starts: on the worker of the preflight tests.
pytestmark = pytest.mark.xdist_group("preflight")


@pytest.fixture(scope="module")
def box():
    podman("rm", "-f", BOX, check=False)
    podman(
        "run", "-d", "--name", BOX, "--hostname", HOST, "--systemd=always", "--shm-size=1g",
        "--publish", "127.0.0.1::22", IMAGE, "/sbin/init",
    )  # fmt: skip
    try:
        yield Box(BOX)
    finally:
        podman("rm", "-f", BOX, check=False)


@pytest.fixture(scope="module")
def deploy(box, tmp_path_factory):
    directory = tmp_path_factory.mktemp("first-deploy")
    connection = ssh_inventory(directory / "ssh.json", HOST, box.container)
    # A second box later in the rollout, never created: the rollout stops before it, and the run's summary
    # repeats this box's line.
    second = directory / "second-box.json"
    never = {"ansible_connection": "containers.podman.podman", "ansible_host": f"{BOX}-never-created"}
    # In sim_boxes, after this box: the rollout's order is the inventory's.
    second.write_text(
        json.dumps(
            {"all": {"children": {"gpu_boxes": {"children": {"sim_boxes": {"hosts": {SECOND_BOX: never}}}}}}}
        )
    )

    def run(*args):
        return run_playbook("deploy.yml", *args, inventory=[ROOT / "inventory/local", connection, second])

    return run


def assert_fell_back(run, box, what):
    assert not run.ok, str(run)
    line = run.failures(HOST)[-1]
    assert line.startswith(f"gate failed on {HOST}: "), line
    assert line.endswith(f"; no last known good on this box yet: {what}"), line
    fallback = run.ran(host=HOST, role="transaction", file="transaction/tasks/fallback.yml")
    assert fallback, str(run)
    # What the fallback serves answered a real completion after its restart.
    ready = run.ran(
        host=HOST, role="vllm_service", file="vllm_service/tasks/ready.yml", action="script", status="ok"
    )
    assert ready and run.results.index(ready[-1]) > run.results.index(fallback[0]), str(run)
    assert box.out("systemctl is-active vllm").strip() == "active"
    assert not box.exists("/var/lib/specfleet/deploy.lock")
    assert not box.exists("/var/lib/specfleet/last_good/record.json")
    assert not run.touched(SECOND_BOX), str(run)


def test_no_release_to_go_back_to_serves_without_speculation(box, deploy):
    run = deploy(*LOW)
    assert_fell_back(
        run, box, "speculation turned off; the target serves without it and answered a completion"
    )
    assert "--speculative-config" not in box.out(f"cat {UNIT}")


def test_the_release_served_before_serves_again(box, deploy):
    """The same drafter as another release: `previous` is the one served before this run, which comes back."""
    before = box.out("readlink /srv/drafters/current").strip()
    run = deploy(*LOW, "-e", "eagle3_drafter_release=again")
    assert_fell_back(
        run,
        box,
        f"rolled back from drafter release again to {before.rsplit('/', 1)[-1]}, "
        "which now serves and answered a completion",
    )
    assert box.out("readlink /srv/drafters/current").strip() == before
    assert "--speculative-config" in box.out(f"cat {UNIT}")
