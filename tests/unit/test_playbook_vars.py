"""Every workflow sees the same variables: a value in the repo's top-level group_vars/ and one in an
inventory's group_vars reach every play on the GPU boxes of deploy.yml and of each playbook of playbooks/.

Ansible loads the playbook-level group_vars/ beside the playbook it was started with, so playbooks/
holds a link to the top-level one; moving a playbook without it would lose those values silently. The
plays are loaded with Ansible's own Playbook and VariableManager, in a copy of the repo whose top-level
group_vars/all.yml holds a probe value (the repo's own holds none).
"""

import json
import pathlib
import shutil
import subprocess
import sys

import pytest
import yaml

ROOT = pathlib.Path(__file__).resolve().parents[2]
PLAYBOOKS = ["deploy.yml", *sorted(str(path.relative_to(ROOT)) for path in ROOT.glob("playbooks/*.yml"))]

# Run inside the copy (its ansible.cfg finds its roles): each play that runs on the box, and the two probes
# as that play would see them for the box.
READ_PLAYS = """
import json, sys
from ansible import context
from ansible.inventory.manager import InventoryManager
from ansible.module_utils.common.collections import ImmutableDict
from ansible.parsing.dataloader import DataLoader
from ansible.playbook import Playbook
from ansible.plugins.loader import init_plugin_loader
from ansible.vars.manager import VariableManager

init_plugin_loader()
context.CLIARGS = ImmutableDict(tags=["all"], skip_tags=[])
loader = DataLoader()
inventory = InventoryManager(loader=loader, sources=[sys.argv[2]])
manager = VariableManager(loader=loader, inventory=inventory)
box = inventory.get_host("box-1")
playbook = Playbook.load(sys.argv[1], variable_manager=manager, loader=loader)
# As ansible-playbook runs it: its variables are read from beside the playbook it was started with.
loader.set_basedir(playbook._basedir)
seen = []
for play in playbook.get_plays():
    if box.name in [host.name for host in inventory.get_hosts(play.hosts)] or play.hosts == "gpu_boxes":
        found = manager.get_vars(play=play, host=box)
        seen.append({"play": play.get_name(), "top": found.get("specfleet_probe_top"),
                     "inventory": found.get("specfleet_probe_inventory")})
print(json.dumps(seen))
"""


@pytest.fixture(scope="module")
def repo_copy(tmp_path_factory):
    copy = tmp_path_factory.mktemp("repo") / "specfleet"
    keep = ("ansible.cfg", "deploy.yml", "playbooks", "group_vars", "roles", "library", "module_utils")
    for name in keep:
        source = ROOT / name
        if source.is_dir():
            shutil.copytree(source, copy / name, symlinks=True)
        else:
            copy.mkdir(parents=True, exist_ok=True)
            shutil.copy(source, copy / name)
    (copy / "group_vars" / "all.yml").write_text(yaml.safe_dump({"specfleet_probe_top": "top"}))
    inventory = copy / "inventory"
    (inventory / "group_vars").mkdir(parents=True)
    (inventory / "hosts.yml").write_text(
        yaml.safe_dump({"all": {"children": {"gpu_boxes": {"hosts": {"box-1": {}}}}}})
    )
    (inventory / "group_vars" / "all.yml").write_text(
        yaml.safe_dump({"specfleet_probe_inventory": "inventory"})
    )
    return copy


@pytest.mark.parametrize("playbook", PLAYBOOKS)
def test_top_level_and_inventory_group_vars_reach_every_play(repo_copy, playbook):
    read = subprocess.run(
        [sys.executable, "-c", READ_PLAYS, playbook, str(repo_copy / "inventory")],
        cwd=repo_copy,
        capture_output=True,
        text=True,
        check=False,
    )
    assert read.returncode == 0, read.stderr
    plays = json.loads(read.stdout.strip().splitlines()[-1])
    assert plays, f"{playbook}: no play on the GPU boxes"
    for play in plays:
        assert (play["top"], play["inventory"]) == ("top", "inventory"), f"{playbook}: {play}"


def test_playbooks_load_the_top_level_group_vars():
    """The link the test above relies on, as the repo ships it."""
    link = ROOT / "playbooks" / "group_vars"
    assert link.is_symlink() and link.resolve() == (ROOT / "group_vars").resolve()
