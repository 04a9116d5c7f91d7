"""What the sim-box benches share: ansible-playbook against a box of their own, timed, with its recap."""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
CACHE = Path(os.environ.get("SPECFLEET_CACHE") or Path.home() / ".cache/specfleet")
# Actions the controller carries out without calling the box (controller_file: action_plugins/).
CONTROLLER_ACTIONS = {
    "controller_file",
    "role_arguments",
    *(
        f"ansible.builtin.{name}"
        for name in [
            "assert",
            "set_fact",
            "debug",
            "fail",
            "validate_argument_spec",
            "include_role",
            "include_tasks",
            "import_role",
            "import_tasks",
            "meta",
            "add_host",
            "group_by",
            "set_stats",
            "include_vars",
        ]
    ),
}


def box_vars(container, ssh_port, server_port):
    """-i arguments: the embedded default's inventory, its box moved to the bench's own container and
    ports. Host vars, not extra vars: an extra ansible_port applies to localhost too, and synchronize
    then takes the box for the controller's own sshd and copies locally."""
    path = CACHE / "bench" / f"{container}.inventory.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    box = {"sim_box_container": container, "ansible_port": ssh_port, "sim_box_host_port": server_port}
    path.write_text(json.dumps({"all": {"hosts": {"sim-gpu-box": box}}}))
    return ["-i", str(ROOT / "inventory/local"), "-i", str(path)]


def playbook(box, name, *args, env=None):
    """(seconds, the last recap line's counters, stdout); the bench stops on a failed run."""
    started = time.monotonic()
    result = subprocess.run(
        [str(BIN / "ansible-playbook"), name, *box, *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env={**os.environ, **(env or {})},
    )
    elapsed = time.monotonic() - started
    if result.returncode != 0:
        sys.exit(f"{name} failed:\n{result.stdout[-3000:]}{result.stderr[-2000:]}")
    recap = [line for line in result.stdout.splitlines() if "changed=" in line]
    # None under the JSON callback, whose stats say the same.
    return elapsed, recap[-1].split(":", 1)[1].strip() if recap else "", result.stdout
