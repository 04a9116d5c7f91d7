"""A bare box to a gated server in one deploy.yml, then a driver upgrade on it (prints figures; not a test).

Creates its own box container (specfleet-bench-bare; SSH on loopback port 22125, the server on 18002):
GPUs on its PCI bus, no driver, no nvidia-smi, the stand-in of NVIDIA's repository served on it beside
Debian's archive (sim/stand_in_cuda_repo.yml). Then measures, each with its recap: the one deploy.yml
run from bare to "gate passed", a second run that changes
nothing, and a run that upgrades the driver on the serving box. Removes the box after.

    .venv/bin/python bench/bare_box_timing.py
"""

import json
import subprocess
import tempfile

from sim_bench import ROOT, box_vars, playbook

BOX = "specfleet-bench-bare"
# Reached over SSH like the default box, on ports of its own.
EXTRA = box_vars(BOX, 22125, 18002)
STAND_IN = ["-e", f"@{ROOT / 'sim/stand_in_cuda_repo_vars.yml'}"]


def main():
    subprocess.run(["podman", "rm", "-f", BOX], capture_output=True, check=False)
    try:
        with tempfile.TemporaryDirectory(prefix="specfleet-bench-repo-") as repo:
            playbook(EXTRA, "sim/start.yml", "-e", json.dumps({"sim_box_driver_installed": False}))
            playbook(
                EXTRA,
                "sim/stand_in_cuda_repo.yml",
                "-e",
                json.dumps({"sim_cuda_repo_dir": f"{repo}/cuda-repo", "sim_cuda_repo_sole_source": False}),
            )
        bare = subprocess.run(
            ["podman", "exec", BOX, "sh", "-c", "command -v nvidia-smi"], capture_output=True
        )
        print(f"before: nvidia-smi on the box   : {'yes' if bare.returncode == 0 else 'no (a bare box)'}")
        first, first_recap, _ = playbook(EXTRA, "deploy.yml", *STAND_IN)
        print(f"bare box -> gate passed, 1 run : {first:7.1f} s   ({first_recap})")
        second, second_recap, _ = playbook(EXTRA, "deploy.yml", *STAND_IN)
        print(f"second run, nothing to change  : {second:7.1f} s   ({second_recap})")
        upgrade, upgrade_recap, upgrade_out = playbook(
            EXTRA, "deploy.yml", *STAND_IN, "-e", "nvidia_cuda_driver_version=575.64.03"
        )
        skipped = "reboot needed and skipped" in upgrade_out
        print(f"driver upgrade, serving box    : {upgrade:7.1f} s   ({upgrade_recap})")
        print(f"  its reboot (a container)     : {'skipped, and said' if skipped else 'not needed'}")
    finally:
        subprocess.run(["podman", "rm", "-f", BOX], capture_output=True, check=False)


if __name__ == "__main__":
    main()
