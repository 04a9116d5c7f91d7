"""What the sim-box benches share: ansible-playbook against a box of their own, timed, with its recap."""

import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent


def box_vars(container, ssh_port, server_port):
    """Extra vars that point the embedded default's inventory at the bench's own box and ports."""
    return [
        "-e",
        f"sim_box_container={container}",
        "-e",
        f"ansible_port={ssh_port}",
        "-e",
        f"sim_box_host_port={server_port}",
    ]


def playbook(box, name, *args):
    """(seconds, the last recap line's counters, stdout); the bench stops on a failed run."""
    started = time.monotonic()
    result = subprocess.run(
        [str(BIN / "ansible-playbook"), name, *box, *args], cwd=ROOT, capture_output=True, text=True
    )
    elapsed = time.monotonic() - started
    if result.returncode != 0:
        sys.exit(f"{name} failed:\n{result.stdout[-3000:]}")
    recap = [line for line in result.stdout.splitlines() if "changed=" in line]
    return elapsed, recap[-1].split(":", 1)[1].strip(), result.stdout
