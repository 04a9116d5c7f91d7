"""Bad input stops a box in preflight with one clear line, before anything changes.

Runs deploy.yml against a real, prepared simulated box (a podman container with systemd) and
checks, for each kind of bad input, the one-line reason and that the box was left untouched.
"""

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
BOX = "specfleet-preflight"
IMAGE = "localhost/specfleet-simbox:bookworm"


def podman(*args, check=True):
    return subprocess.run(["podman", *args], capture_output=True, text=True, check=check)


def playbook(name, *args):
    return subprocess.run(
        [str(BIN / "ansible-playbook"), name, "-e", f"ansible_host={BOX}", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )


@pytest.fixture(scope="module")
def box():
    podman("rm", "-f", BOX, check=False)
    podman("run", "-d", "--name", BOX, "--systemd=always", IMAGE, "/sbin/init")
    try:
        prepared = playbook("playbooks/sim_box_prepare.yml")
        assert prepared.returncode == 0, prepared.stdout[-3000:]
        yield BOX
    finally:
        podman("rm", "-f", BOX, check=False)


def assert_stopped_untouched(result, reason):
    output = result.stdout + result.stderr
    assert result.returncode != 0, output[-3000:]
    assert reason in output, output[-3000:]
    recap = [line for line in output.splitlines() if line.startswith("sim-gpu-box ")][-1]
    assert "changed=0" in recap, recap
    # Nothing of the deployment exists: no service user, no venv, no unit.
    assert podman("exec", BOX, "id", "vllm", check=False).returncode != 0
    for path in ("/opt/vllm", "/etc/systemd/system/vllm.service"):
        assert podman("exec", BOX, "test", "-e", path, check=False).returncode != 0, f"{path} was created"


@pytest.mark.parametrize(
    ("extra_vars", "reason"),
    [
        (
            ["-e", "gpu_topology_nvidia_smi=nvidia-smi-missing"],
            "nvidia-smi-missing not found",
        ),
        (["-e", "preflight_gpu_count=4"], "the inventory says 4 GPUs but nvidia-smi found 8 on sim-gpu-box"),
        (["-e", "preflight_min_free_disk_gb=1000000"], "GB needed (preflight_min_free_disk_gb)"),
        (
            ["-e", "vllm_service_model_path=/srv/models/no-such-model"],
            "/srv/models/no-such-model does not exist on sim-gpu-box",
        ),
        (
            ["-e", "vllm_service_tensor_parallel_size=16"],
            "vllm_service_tensor_parallel_size=16 must be between 1",
        ),
        (["-e", "vllm_service_port=not-a-port"], "argument 'vllm_service_port' is of type str"),
    ],
    ids=["no-nvidia-smi", "gpu-count", "disk", "model-path", "tp-size", "wrong-type"],
)
def test_bad_input_stops_in_preflight(box, extra_vars, reason):
    assert_stopped_untouched(playbook("deploy.yml", *extra_vars), reason)


def test_taken_port_stops_in_preflight(box):
    podman(
        "exec",
        "-d",
        box,
        "python3",
        "-m",
        "http.server",
        "8000",
        "--bind",
        "127.0.0.1",
        "--directory",
        "/tmp",
    )
    try:
        result = playbook("deploy.yml")
    finally:
        podman("exec", box, "pkill", "-f", "http.server", check=False)
    assert_stopped_untouched(result, "port 8000 is already taken on sim-gpu-box: held by python3")
