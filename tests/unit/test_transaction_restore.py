"""The transaction's restore (roles/transaction/tasks/restore.yml) acts on what the record says served, not
on what this run pinned, and reads the server's state as systemd holds it once the restored unit is
back on disk."""

import json
import sys
from pathlib import Path

import yaml
from driver import run_playbook
from task_files import tasks_of

RESTORE = Path(__file__).resolve().parents[2] / "roles/transaction/tasks/restore.yml"
# What the restore asks of the server's owner (roles/vllm_service's entry point restore).
SERVER_RESTORE = Path(__file__).resolve().parents[2] / "roles/vllm_service/tasks/restore.yml"


def restore_tasks():
    return list(tasks_of(yaml.safe_load(RESTORE.read_text())))


def patch_include():
    (task,) = [
        task
        for task in restore_tasks()
        if task.get("ansible.builtin.include_role", {}).get("name") == "vllm_eagle3_patch"
    ]
    return task


def test_the_recorded_patch_state_goes_into_the_recorded_release(tmp_path):
    """Run as the restore runs it: the record's venv (a vLLM 0.32.0, which the module reads and leaves),
    while this run pinned another release and an inventory-level package path, neither of which exists."""
    recorded = tmp_path / "releases/recorded"
    package = recorded / "lib/python3.11/site-packages/vllm"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "_version.py").write_text("__version__ = version = '0.32.0'\n")
    pinned = tmp_path / "releases/pinned"
    inventory = tmp_path / "inventory.yml"
    box = {
        "ansible_connection": "local",
        "ansible_python_interpreter": sys.executable,
        "vllm_venv": str(pinned),
        "vllm_eagle3_patch_vllm_path": str(pinned / "lib/python3.11/site-packages/vllm"),
    }
    inventory.write_text(json.dumps({"all": {"hosts": {"localhost": box}}}))
    record = {"serving": {"eagle3_patch": "absent"}, "details": {"vllm_venv": str(recorded)}}
    playbook = tmp_path / "restore.yml"
    facts = {"ansible.builtin.set_fact": {"last_good": record, "__transaction_patch_differs": True}}
    playbook.write_text(
        json.dumps([{"hosts": "localhost", "gather_facts": False, "tasks": [facts, patch_include()]}])
    )
    run = run_playbook(playbook, inventory=inventory)
    result = run.one(host="localhost", action="vllm_eagle3_patch")
    assert run.ok and result.result["vllm_path"] == str(package), str(run)
    assert result.result["vllm_version"] == "0.32.0" and not result.changed, str(run)


def test_the_state_is_read_after_a_reload_and_before_any_restart():
    """A unit file systemd refused stays refused in its memory until a reload, even with the recorded
    file back on disk: the state read reloads first."""
    tasks = list(tasks_of(yaml.safe_load(SERVER_RESTORE.read_text())))
    (read,) = [task for task in tasks if task.get("register") == "__vllm_service_restore_unit"]
    assert read["ansible.builtin.systemd_service"].get("daemon_reload") is True, read
    restart = next(task for task in tasks if task.get("ansible.builtin.include_tasks") == "restart.yml")
    assert tasks.index(read) < tasks.index(restart)
