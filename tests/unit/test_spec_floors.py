"""A box's gate floors at every k, computed once (filter_plugins/spec_floors.py, roles/served's
served_floors): the one place the floor model lives, which the gate, the tuner, the watcher, the report and
the rules read."""

import re
from pathlib import Path

import pytest
from driver import run_playbook
from script_module import call_apart

FILTER = Path(__file__).resolve().parents[2] / "filter_plugins/spec_floors.py"


def spec_floors(*arguments):
    [answer] = call_apart(FILTER, "spec_floors", list(arguments))
    assert "answer" in answer, answer
    return answer["answer"]


STATED = {"mean_acceptance_length": 2.2, "acceptance_rate": 0.4}


def test_floors_mean_the_same_drafter_quality_at_every_k():
    floors = spec_floors(STATED, 3, 4)
    means = [floors["by_k"][str(k)]["mean_acceptance_length"] for k in (1, 2, 3, 4)]
    assert means == [1.6073, 1.9761, 2.2, 2.336]
    # At its own k a floor is exactly as stated; a floor at k=1 can never exceed 2 (one drafted token).
    assert floors["by_k"]["3"] == STATED
    assert floors["by_k"]["1"]["acceptance_rate"] == 0.6073
    # The sim's known drafters keep their verdicts at k=1: 3.4 (0.895 at position 0) passes, 1.4 (0.261)
    # fails.
    assert 1.895 > floors["by_k"]["1"]["mean_acceptance_length"] > 1.261
    # The per-position acceptance each floor means, for the Prometheus rules (a rate r at k is 1 + r * k).
    assert floors["alpha"] == {"mean_acceptance_length": 0.607272, "acceptance_rate": 0.607272}


def test_the_table_reaches_the_floors_own_k_and_no_further():
    assert sorted(spec_floors(STATED, 3, 1)["by_k"], key=int) == ["1", "2", "3"]
    assert sorted(spec_floors(STATED, 3, 6)["by_k"], key=int) == ["1", "2", "3", "4", "5", "6"]


def test_floors_at_k_0_take_each_floor_as_stated_at_every_k():
    floors = spec_floors(STATED, 0, 3)
    assert floors["alpha"] == {"mean_acceptance_length": None, "acceptance_rate": None}
    assert all(at_k == STATED for at_k in floors["by_k"].values())


def test_only_the_gated_figures_are_in_the_table():
    floors = spec_floors({"mean_acceptance_length": 2.2}, 3, 2)
    assert floors["by_k"] == {
        "1": {"mean_acceptance_length": 1.6073},
        "2": {"mean_acceptance_length": 1.9761},
        "3": {"mean_acceptance_length": 2.2},
    }
    assert spec_floors({}, 3, 2)["by_k"] == {"1": {}, "2": {}, "3": {}}


@pytest.mark.parametrize(
    ("figures", "error"),
    [
        (
            {"mean_acceptance_length": 4.5},
            r"mean_acceptance_length 4.5: a mean acceptance length floor at k=3 lies in \[1, 4\]",
        ),
        ({"tokens_per_second": 10}, "no floor model for tokens_per_second"),
    ],
)
def test_a_floor_the_model_cannot_take_is_one_line(figures, error):
    [answer] = call_apart(FILTER, "spec_floors", [figures, 3, 3])
    assert answer["error"].startswith("AnsibleTemplatePluginError: spec_floors: "), answer
    assert re.search(error, answer["error"]), answer


def test_served_hands_every_play_the_table_its_k_needs(tmp_path):
    """roles/served's fact, as a play reads it: the table reaches the tuner's largest k."""
    inventory = tmp_path / "inventory.json"
    inventory.write_text(
        '{"all": {"children": {"gpu_boxes": {"hosts": {"box-a": {"ansible_connection": "local", '
        '"spec_tune_max_k": 5, "eagle3_drafter_source": "/srv/drafters/incoming"}}}}}}'
    )
    playbook = tmp_path / "served.yml"
    playbook.write_text(
        "- hosts: gpu_boxes\n  gather_facts: false\n  roles: [served]\n"
        "  tasks:\n    - ansible.builtin.debug: {var: served_floors}\n"
    )
    run = run_playbook(str(playbook), inventory=inventory)
    assert run.ok, str(run)
    floors = run.one(action="ansible.builtin.debug").result["served_floors"]
    assert floors["by_k"] == spec_floors(STATED, 3, 5)["by_k"]
    assert floors["figures"] == STATED and floors["floors_at_k"] == 3 and floors["speculation"] is True
