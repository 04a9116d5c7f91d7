"""An inventory's group_vars/all.yml wins for every knob: all that the README and docs/ document, and every
other default the roles give (an inventory must be able to override everything).

Ansible ranks playbook-level group_vars/all (beside deploy.yml) above an inventory's
group_vars/all, and role vars/, play vars and set_fact above both: a default in any of those would
silently ignore an operator's value. So every default lives in roles/*/defaults/main.yml.
"""

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent


def settable_names():
    """Every variable the repo gives a value an operator might change: role defaults, and whatever
    sits in the playbook-level group_vars (where it would wrongly outrank the inventory)."""
    names = set()
    for path in [*ROOT.glob("roles/*/defaults/main.yml"), *ROOT.glob("group_vars/*.yml")]:
        names |= set(yaml.safe_load(path.read_text()) or {})
    return names


def documented_knobs():
    """The settable names the README and docs/ name."""
    text = "\n".join(path.read_text() for path in [ROOT / "README.md", *sorted(ROOT.glob("docs/*.md"))])
    words = set(re.findall(r"[a-z][a-z0-9_]+", text))
    return sorted(name for name in settable_names() if name in words)


KNOBS = sorted(settable_names())


def test_the_readme_documents_knobs_of_every_family():
    documented = documented_knobs()
    prefixes = {knob.split("_")[0] for knob in documented}
    assert len(documented) > 20, documented
    assert {"gate", "nccl", "nvidia", "vllm", "eagle3", "gpu"} <= prefixes, prefixes


def test_an_inventory_group_vars_all_wins_for_every_knob(tmp_path):
    inventory = tmp_path / "inventory"
    (inventory / "group_vars").mkdir(parents=True)
    (inventory / "hosts.yml").write_text(
        yaml.safe_dump({"all": {"children": {"gpu_boxes": {"hosts": {"box-01": {}}}}}})
    )
    wanted = {knob: f"from-the-inventory-{knob}" for knob in KNOBS}
    (inventory / "group_vars" / "all.yml").write_text(yaml.safe_dump(wanted))
    shown = subprocess.run(
        [
            str(BIN / "ansible-inventory"),
            "-i",
            str(inventory),
            "--playbook-dir",
            str(ROOT),
            "--host",
            "box-01",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    )
    resolved = json.loads(shown.stdout)
    lost = {knob: resolved.get(knob) for knob, value in wanted.items() if resolved.get(knob) != value}
    assert not lost, f"the inventory's group_vars/all.yml lost to: {lost}"


def tasks_in(path):
    """Every task of a task file, blocks opened."""
    stack = list(yaml.safe_load(path.read_text()) or [])
    while stack:
        task = stack.pop()
        for key in ("block", "rescue", "always"):
            stack += task.get(key, [])
        yield task


@pytest.mark.parametrize(
    "where",
    ["playbook group_vars and host_vars", "play vars of deploy.yml", "role vars", "set_fact in a role"],
)
def test_nothing_that_outranks_an_inventory_sets_a_knob(where):
    knobs = set(KNOBS)
    found = {}
    if where == "playbook group_vars and host_vars":
        for path in [*ROOT.glob("group_vars/*.yml"), *ROOT.glob("host_vars/*.yml")]:
            found[str(path.relative_to(ROOT))] = set(yaml.safe_load(path.read_text()) or {}) & knobs
    elif where == "play vars of deploy.yml":
        for play in yaml.safe_load((ROOT / "deploy.yml").read_text()):
            found[play["name"]] = set(play.get("vars", {})) & knobs
    elif where == "role vars":
        for path in ROOT.glob("roles/*/vars/main.yml"):
            found[str(path.relative_to(ROOT))] = set(yaml.safe_load(path.read_text()) or {}) & knobs
    else:
        for path in ROOT.glob("roles/*/tasks/*.yml"):
            for task in tasks_in(path):
                facts = task.get("ansible.builtin.set_fact") or task.get("set_fact") or {}
                found.setdefault(str(path.relative_to(ROOT)), set()).update(set(facts) & knobs)
    assert not {place: names for place, names in found.items() if names}
