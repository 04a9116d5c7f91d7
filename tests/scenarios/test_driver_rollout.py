"""A driver rollout over two bare boxes, one box at a time (deploy.yml's serial 1, max_fail_percentage 0).

Two real sim boxes (podman containers with systemd) whose PCI bus shows eight GPUs and that have no
driver; each serves the stand-in of NVIDIA's repository (sim/stand_in_cuda_repo.yml). Bad driver input
stops the first box with one line, and the second box is never touched.
"""

import json

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


def assert_second_box_untouched(run):
    assert "box-b" not in run.hosts(), str(run)
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
        "directory; the release is broken or incomplete, the rollout stops here"
    ], str(run)
    assert_second_box_untouched(run)
