"""callback_plugins/retry_progress.py: a retried task's latest line shows at default verbosity, as the
repo's ansible.cfg enables it (the wait for an engine that loads for minutes prints its load stage)."""

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_each_retry_shows_its_last_line(tmp_path):
    counter = tmp_path / "attempts"
    attempt = f'n=$(($(cat {counter} 2>/dev/null || echo 0) + 1)); echo $n > {counter}; echo "stage $n"; '
    attempt += "[ $n -ge 3 ]"
    task = {"ansible.builtin.shell": attempt, "register": "tried", "until": "tried.rc == 0", "retries": 4}
    play = {
        "hosts": "localhost",
        "connection": "local",
        "gather_facts": False,
        "tasks": [{**task, "delay": 0}],
    }
    playbook = tmp_path / "retry.yml"
    playbook.write_text(json.dumps([play]))
    # An operator's shell: the repo's ansible.cfg, none of the test run's Ansible settings.
    env = {k: v for k, v in os.environ.items() if not k.startswith("ANSIBLE_")}
    done = subprocess.run(
        [str(Path(sys.executable).with_name("ansible-playbook")), "-i", "localhost,", str(playbook)]
        + ["-e", f"ansible_python_interpreter={sys.executable}"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    shown = [line.strip() for line in done.stdout.splitlines() if line.startswith("  localhost: ")]
    assert shown == ["localhost: stage 1", "localhost: stage 2"], done.stdout
