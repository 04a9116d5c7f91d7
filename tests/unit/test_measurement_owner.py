"""Measurement as one capability: the gate judges and the tuner chooses, and what either measures without
speculation (the gate's baseline, the tuner's k = 0) is roles/measurement's, on one trial unit. Neither the
gate nor the tuner includes the other; both include roles/measurement's speculation_off."""

import pathlib

import yaml
from task_files import tasks_of

ROLES = pathlib.Path(__file__).resolve().parents[2] / "roles"
INCLUDES = ("ansible.builtin.include_role", "ansible.builtin.import_role")


def included_roles(role: str) -> set[tuple[str, str]]:
    """(role, entry point) of every role the role's tasks include or import."""
    found = set()
    for path in sorted((ROLES / role / "tasks").glob("*.yml")):
        for task in tasks_of(yaml.safe_load(path.read_text())):
            for key in INCLUDES:
                if key in task:
                    found.add((task[key]["name"], task[key].get("tasks_from", "main")))
    return found


def test_neither_the_gate_nor_the_tuner_includes_the_other():
    gate, tuner = included_roles("gate"), included_roles("spec_tune")
    assert not {name for name, _ in gate} & {"spec_tune"}, gate
    assert not {name for name, _ in tuner} & {"gate"}, tuner


def test_both_measure_without_speculation_through_roles_measurement():
    assert ("measurement", "speculation_off") in included_roles("gate")
    assert ("measurement", "speculation_off") in included_roles("spec_tune")
    # Its one trial: the serving unit's owner's trial entry point, ended whatever happened.
    assert {("vllm_service", "trial"), ("vllm_service", "trial_end")} <= included_roles("measurement")
