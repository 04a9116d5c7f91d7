"""A condition on an include or import never reads a variable that the same task's `vars:` sets.

Ansible evaluates a task's `when` with the task's own `vars` in scope: `when: recorded != state` beside
`vars: {state: recorded}` is always false, and what it guards never runs (the transaction's restore of
the EAGLE-3 patch state once did exactly that)."""

import pathlib
import re

import yaml
from task_files import tasks_of

REPO = pathlib.Path(__file__).resolve().parents[2]
INCLUDES = {
    f"ansible.builtin.{name}" for name in ("include_role", "import_role", "include_tasks", "import_tasks")
}


def task_files():
    for path in sorted(
        [*REPO.glob("roles/*/tasks/*.yml"), *REPO.glob("playbooks/**/*.yml"), REPO / "deploy.yml"]
    ):
        content = yaml.safe_load(path.read_text())
        plays = content if isinstance(content, list) else []
        for item in plays:
            if isinstance(item, dict) and "hosts" in item:
                yield from (
                    (path, task)
                    for key in ("tasks", "pre_tasks", "post_tasks")
                    for task in tasks_of(item.get(key))
                )
            else:
                yield from ((path, task) for task in tasks_of([item]))


def shadowed():
    for path, task in task_files():
        if not INCLUDES & set(task) or not task.get("vars") or "when" not in task:
            continue
        conditions = " ".join(map(str, task["when"] if isinstance(task["when"], list) else [task["when"]]))
        for name in task["vars"]:
            if re.search(rf"\b{re.escape(name)}\b", conditions):
                yield f"{path.relative_to(REPO)}: {task.get('name')}: when reads {name}, which its vars set"


def test_the_repo_has_conditional_includes_with_vars():
    assert any(INCLUDES & set(task) and task.get("vars") and "when" in task for _, task in task_files())


def test_no_condition_reads_its_own_vars():
    assert list(shadowed()) == []
