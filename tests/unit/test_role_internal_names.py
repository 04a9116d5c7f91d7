"""What a role sets for itself carries `__<role>_`; what it hands on is documented.

Registered results, set_fact facts and vars/main.yml entries are a role's internal state unless its
meta/argument_specs.yml names them (`C(name)`) as handed on to other roles; other roles read only
those, or an entry point's documented results.
"""

import pathlib
import re

import pytest
import yaml
from task_files import tasks_of

REPO = pathlib.Path(__file__).resolve().parent.parent.parent


def names_set_by(role: pathlib.Path):
    """(file, name) for every register, set_fact key and vars/main.yml entry of the role."""
    for path in sorted([*role.glob("tasks/*.yml"), *role.glob("handlers/*.yml")]):
        for task in tasks_of(yaml.safe_load(path.read_text())):
            if "register" in task:
                yield path, task["register"]
            facts = task.get("ansible.builtin.set_fact") or task.get("set_fact") or {}
            yield from ((path, name) for name in facts if name != "cacheable")
    variables = role / "vars" / "main.yml"
    if variables.exists():
        yield from ((variables, name) for name in yaml.safe_load(variables.read_text()) or {})


def handed_on(role: pathlib.Path) -> set[str]:
    spec = role / "meta" / "argument_specs.yml"
    return set(re.findall(r"C\((\w+)\)", spec.read_text())) if spec.exists() else set()


def misnamed(roles_dir: pathlib.Path) -> list[str]:
    problems = []
    for role in sorted(path for path in roles_dir.iterdir() if path.is_dir()):
        documented = handed_on(role)
        for path, name in names_set_by(role):
            if not name.startswith(f"__{role.name}_") and name not in documented:
                where = path.relative_to(roles_dir)
                problems.append(f"{where}: {name} (neither __{role.name}_… nor handed on)")
    return problems


def test_every_role_keeps_its_own_state_prefixed():
    assert not misnamed(REPO / "roles"), "\n".join(misnamed(REPO / "roles"))


@pytest.mark.parametrize(
    ("tasks", "vars_main", "spec", "expected"),
    [
        ("- register: demo_result\n  ansible.builtin.command: 'true'\n", "", "", ["demo_result"]),
        ("- ansible.builtin.set_fact:\n    demo_fact: 1\n", "", "", ["demo_fact"]),
        ("", "demo_derived: 1\n", "", ["demo_derived"]),
        ("- block:\n    - register: nested\n      ansible.builtin.command: 'true'\n", "", "", ["nested"]),
        ("- ansible.builtin.set_fact:\n    demo_out: 1\n", "", "description: [Hands on C(demo_out).]\n", []),
        ("- register: __demo_result\n  ansible.builtin.command: 'true'\n", "__demo_x: 1\n", "", []),
    ],
    ids=["register", "set-fact", "vars-main", "inside-block", "handed-on", "prefixed"],
)
def test_unprefixed_undocumented_state_is_reported(tmp_path, tasks, vars_main, spec, expected):
    role = tmp_path / "demo"
    for folder, text in (("tasks", tasks), ("vars", vars_main), ("meta", spec)):
        (role / folder).mkdir(parents=True)
        if text:
            name = "argument_specs.yml" if folder == "meta" else "main.yml"
            (role / folder / name).write_text("---\n" + text)
    found = [problem.split(": ", 1)[1].split(" ")[0] for problem in misnamed(tmp_path)]
    assert found == expected
