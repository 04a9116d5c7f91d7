"""Rollouts over several boxes, one box at a time (deploy.yml's serial 1) within a failure budget
(roles/rollout's rollout_max_fail_percentage, an inventory value, default 0).

Two real sim boxes (podman containers with systemd) whose PCI bus shows eight GPUs and that have no
driver; each serves the stand-in of NVIDIA's repository (sim/stand_in_cuda_repo.yml). Bad driver input
stops the first box with one line, and the second box is never touched. Boxes that cannot be worked on
(unreachable, a changed SSH host key, a refused become) fail in one line each with nothing run on them;
the rest of the rollout goes on or stops as the budget says.
"""

import json
import socket
import subprocess

import pytest
from driver import ROOT, Box, podman, run_playbook, ssh_inventory

IMAGE = "localhost/specfleet-simbox:bookworm"
BOXES = {"box-a": "specfleet-rollout-a", "box-b": "specfleet-rollout-b"}
LIMIT = ("--limit", ",".join(BOXES))
# Light boxes (no vLLM): on the worker of the preflight tests.
pytestmark = pytest.mark.xdist_group("preflight")


@pytest.fixture(scope="module")
def fleet(tmp_path_factory):
    """The two boxes, bare and serving the stand-in repository; yields the inventories deploy.yml takes."""
    workdir = tmp_path_factory.mktemp("rollout")
    for container in BOXES.values():
        podman("rm", "-f", container, check=False)
        podman(
            "run",
            "-d",
            "--name",
            container,
            "--systemd=always",
            "--publish",
            "127.0.0.1::22",
            IMAGE,
            "/sbin/init",
        )
    try:
        boxes = workdir / "boxes.json"
        hosts = {name: {"sim_box_container": container} for name, container in BOXES.items()}
        boxes.write_text(
            json.dumps({"all": {"children": {"gpu_boxes": {"children": {"sim_boxes": {"hosts": hosts}}}}}})
        )
        sim = [ROOT / "inventory/local", boxes]
        bare = {"sim_box_driver_installed": False}
        prepared = run_playbook("sim/prepare.yml", *LIMIT, extra_vars=bare, inventory=sim)
        assert prepared.ok, str(prepared)
        served = run_playbook(
            "sim/stand_in_cuda_repo.yml",
            "--limit",
            ",".join([*BOXES, "localhost"]),
            "-e",
            f"sim_cuda_repo_dir={workdir / 'cuda-repo'}",
            inventory=sim,
        )
        assert served.ok, str(served)
        connections = [ssh_inventory(workdir / f"{name}.json", name, box) for name, box in BOXES.items()]
        yield [*sim, *connections]
    finally:
        for container in BOXES.values():
            podman("rm", "-f", container, check=False)


def rollout(fleet, driver):
    return run_playbook(
        "deploy.yml",
        *LIMIT,
        "-e",
        f"@{ROOT / 'sim/stand_in_cuda_repo_vars.yml'}",
        "-e",
        f"nvidia_cuda_driver_version={driver}",
        inventory=fleet,
    )


def budget_run(fleet, *hosts):
    """deploy.yml --check over these boxes, in this order (a bare box's dry run ends after the driver's
    description: the path through reach, preflight and lock, without a server)."""
    return run_playbook(
        "deploy.yml",
        "--check",
        "--limit",
        ",".join(hosts),
        "-e",
        f"@{ROOT / 'sim/stand_in_cuda_repo_vars.yml'}",
        inventory=fleet,
    )


@pytest.fixture(scope="module")
def troubled(fleet, tmp_path_factory):
    """Inventories that put three boxes in trouble before box-a: box-gone (nothing listens on its port),
    box-rekeyed (box-a's sshd, but known_hosts holds another key for it) and box-nosudo (box-b, logged in
    as a user sudo refuses). Yields {budget: the inventories, the troubled boxes first}."""
    workdir = tmp_path_factory.mktemp("troubled")
    with socket.socket() as probe:  # a loopback port nothing listens on
        probe.bind(("127.0.0.1", 0))
        closed = probe.getsockname()[1]
    box_a, box_b = (
        json.loads(next(p for p in fleet if p.name == f"{name}.json").read_text())["all"]["hosts"][name]
        for name in ("box-a", "box-b")
    )
    stranger = workdir / "stranger"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(stranger)], check=True)
    known = workdir / "known_hosts"
    key = " ".join((workdir / "stranger.pub").read_text().split()[:2])
    known.write_text(f"specfleet-simbox {key}\n")
    box = Box(BOXES["box-b"])
    box.sh(
        "id nosudo >/dev/null 2>&1 || useradd -m nosudo && mkdir -p ~nosudo/.ssh && "
        "cp ~specfleet/.ssh/authorized_keys ~nosudo/.ssh/ && chown -R nosudo ~nosudo/.ssh"
    )
    hosts = {
        "box-gone": {"ansible_connection": "ssh", "ansible_host": "127.0.0.1", "ansible_port": closed},
        # Its own SSH session: box-a's multiplexed one would skip the host key check (a box reinstalled
        # since has none left).
        "box-rekeyed": {
            **box_a,
            "ansible_ssh_args": "-o ControlPath=none",
            "ansible_ssh_common_args": f"-o UserKnownHostsFile={known} -o HostKeyAlias=specfleet-simbox "
            "-o StrictHostKeyChecking=yes",
        },
        "box-nosudo": {**box_b, "ansible_user": "nosudo"},
    }
    inventories = {}
    for budget in (0, 50, 75):
        path = workdir / f"troubled-{budget}.json"
        group = {"hosts": hosts, "vars": {"rollout_max_fail_percentage": budget}}
        path.write_text(json.dumps({"all": {"children": {"gpu_boxes": {"children": {"sim_boxes": group}}}}}))
        inventories[budget] = [path, *fleet]  # first: its boxes come first in the rollout
    yield inventories
    box.sh("userdel -r nosudo", check=False)


def test_an_unreachable_box_stops_a_rollout_without_budget(troubled):
    """Budget 0 (the default): the unreachable box fails in one line and the rollout stops before box-a."""
    run = budget_run(troubled[0], "box-gone", "box-a")
    assert not run.ok, str(run)
    [line] = run.failures("box-gone")
    assert line.startswith("box-gone is unreachable: ") and line.endswith("; nothing was run on it"), line
    assert "Connection refused" in line, line
    assert not run.touched("box-a"), str(run)
    assert run.failures("box-a") == [
        "not deployed: the rollout stopped, 1 of 2 boxes failed (box-gone), "
        "more than rollout_max_fail_percentage 0%"
    ], str(run)


def test_troubled_boxes_within_the_budget(troubled):
    """Budget 75%: an unreachable box, a changed host key and a refused become fail in one line each, with
    nothing run on them (3 of 4 is not more than 75%), and box-a's run goes on; the run exits non-zero."""
    run = budget_run(troubled[75], "box-gone", "box-rekeyed", "box-nosudo", "box-a")
    assert not run.ok, str(run)
    [gone] = run.failures("box-gone")
    assert gone.startswith("box-gone is unreachable: ") and "Connection refused" in gone, gone
    assert run.failures("box-rekeyed") == [
        "box-rekeyed: its SSH host key is not the one known_hosts holds for it "
        "(REMOTE HOST IDENTIFICATION HAS CHANGED); nothing was run on it. "
        "If the box was reinstalled, replace its known_hosts entry"
    ], str(run)
    [nosudo] = run.failures("box-nosudo")
    assert nosudo.startswith("box-nosudo answers, but not with become (sudo as nosudo): "), nosudo
    assert "sudo password" in nosudo and nosudo.endswith("; nothing was run on it"), nosudo
    for host in ("box-gone", "box-rekeyed", "box-nosudo"):
        assert not run.touched(host), str(run)
    assert run.failures("box-a") == [], str(run)
    assert run.ran(host="box-a", role="nvidia_cuda"), str(run)
    # The budget was not spent: playbooks/monitoring.yml ran after the rollout (its alerts watch every box,
    # the failed ones too): roles/served ran on a failed box twice, in its batch and in monitoring's play.
    assert len(run.ran(host="box-gone", role="served", file="served/tasks/main.yml")) == 2, str(run)


def test_the_budget_spent_stops_the_rollout(troubled):
    """Budget 50% of 4 boxes: after two failed boxes the rollout goes on, after the third it stops; box-a,
    last, is never touched, and monitoring.yml is skipped."""
    run = budget_run(troubled[50], "box-gone", "box-rekeyed", "box-nosudo", "box-a")
    assert not run.ok, str(run)
    assert all(len(run.failures(host)) == 1 for host in ("box-gone", "box-rekeyed", "box-nosudo")), str(run)
    assert not run.touched("box-a"), str(run)
    assert run.failures("box-a") == [
        "not deployed: the rollout stopped, 3 of 4 boxes failed (box-gone, box-rekeyed, box-nosudo), "
        "more than rollout_max_fail_percentage 50%"
    ], str(run)
    # playbooks/monitoring.yml was skipped: roles/served ran on a failed box in its batch only.
    assert len(run.ran(host="box-gone", role="served", file="served/tasks/main.yml")) == 1, str(run)


def assert_second_box_untouched(run):
    assert not run.touched("box-b"), str(run)
    box = Box(BOXES["box-b"])
    assert not box.exists("/etc/apt/sources.list.d/nvidia-cuda.sources")
    assert box.sh("dpkg-query --show 'nvidia*'", check=False).returncode != 0


def test_a_driver_version_the_repository_does_not_have(fleet):
    """One line once the repository is configured, before any package is installed or unheld."""
    run = rollout(fleet, "575.99.99")
    assert not run.ok, str(run)
    failed = run.ran(host="box-a", role="nvidia_cuda", file="nvidia_cuda/tasks/packages.yml", status="failed")
    assert [r.msg for r in failed] == [
        "box-a: nvidia-open-575=575.99.99, nvidia-persistenced=575.99.99 not in "
        "http://127.0.0.1:8731/debian12/x86_64/ (nvidia_cuda_driver_version, nvidia_cuda_toolkit_version); "
        "it offers nvidia-open-575 575.64.05-1, 575.64.03-1, 575.57.08-1"
    ], str(run)
    box = Box(BOXES["box-a"])
    assert box.exists("/etc/apt/sources.list.d/nvidia-cuda.sources")
    assert box.sh("dpkg-query --show 'nvidia*' 'cuda*'", check=False).returncode != 0
    assert_second_box_untouched(run)


def test_a_broken_driver_stops_the_rollout(fleet):
    """575.64.05's nvidia-smi cannot run once installed: the first box fails with one line, even though its
    reboot is skipped in a container, and the rollout stops before the second box."""
    run = rollout(fleet, "575.64.05")
    assert not run.ok, str(run)
    failed = run.ran(host="box-a", role="nvidia_cuda", file="nvidia_cuda/tasks/verify.yml", status="failed")
    assert [r.msg for r in failed] == [
        "box-a: nvidia-smi cannot run after driver 575.64.05 was installed (rc=127): nvidia-smi: error while "
        "loading shared libraries: libnvidia-ml.so.1: cannot open shared object file: No such file or "
        "directory; the release is broken or incomplete"
    ], str(run)
    assert_second_box_untouched(run)
