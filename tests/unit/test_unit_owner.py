"""One owner of the serving and trial units: every systemd action on them (start, stop, restart, reload,
reset-failed) is a task of roles/vllm_service; the other roles call its entry points. Reading the unit's
state is not an action. The spec watcher's script, which acts holding the box's lock, is tested with it
(tests/unit/test_spec_watch.py)."""

import pathlib

import yaml
from task_files import tasks_of

ROLES = pathlib.Path(__file__).resolve().parents[2] / "roles"
# How a task names the serving unit (or a variable set to it), or the trial unit made from its name.
SERVING = ("vllm_service_name", "nccl_tune_service", "__vllm_service_trial_unit", "nvidia_cuda_gpu_services")
READS = ("is-active", "show", "status", "cat")


def systemd_actions(role: pathlib.Path):
    """(file, task name) for each task of the role that acts on a unit through systemd."""
    for path in sorted([*role.glob("tasks/*.yml"), *role.glob("handlers/*.yml")]):
        for task in tasks_of(yaml.safe_load(path.read_text())):
            module = task.get("ansible.builtin.systemd_service")
            if module is not None:
                yield path, task, str(module.get("name", "")) + str(task.get("loop", ""))
            argv = (task.get("ansible.builtin.command") or {}).get("argv") or []
            if argv[:1] == ["systemctl"] and argv[1] not in READS:
                yield path, task, " ".join(map(str, argv))


def test_only_vllm_service_acts_on_the_serving_and_trial_units():
    acting = [
        f"{path.relative_to(ROLES)}: {task.get('name')}"
        for role in sorted(ROLES.iterdir())
        for path, task, unit in systemd_actions(role)
        if role.name != "vllm_service"
        and any(name in unit for name in SERVING)
        and "reject('eq', vllm_service_name" not in unit
    ]
    assert not acting, acting


def test_the_owner_is_found_acting():
    """The same reading finds the owner's own actions (a test that could not fail would find none)."""
    owner = {
        (unit, task["ansible.builtin.systemd_service"].get("state"))
        for _, task, unit in systemd_actions(ROLES / "vllm_service")
        if "ansible.builtin.systemd_service" in task
    }
    assert {("{{ vllm_service_name }}", "stopped"), ("{{ vllm_service_name }}", "restarted")} <= owner, owner
