"""Every targeted box's inventory values are checked before any box changes (playbooks/common/box.yml's first
play, roles/validate_inventory): a bad value on any box fails every box, each bad box with its one line and
the others naming them, and no later play runs. The boxes here listen nowhere: a run that got past the
checks would find them unreachable."""

import json
import re
import socket
import subprocess
import sys

import pytest
from driver import ROOT, run_playbook

# A loopback port nothing listens on: connecting to it is refused at once.
with socket.socket() as _probe:
    _probe.bind(("127.0.0.1", 0))
    CLOSED = _probe.getsockname()[1]
NOWHERE = {"ansible_host": "127.0.0.1", "ansible_port": CLOSED, "ansible_user": "nobody"}
BAD = {
    "box-b": ({"vllm_service_port": 99999}, "vllm_service_port=99999 is not a TCP port (1-65535)"),
    "box-c": (
        {"vllm_proxy_timeout_s": 0},
        "vllm_proxy_timeout_s=0 is not a number of seconds of at least 1: every request through the proxy "
        "would time out",
    ),
}


@pytest.fixture(scope="module")
def fleet(tmp_path_factory):
    path = tmp_path_factory.mktemp("fleet") / "fleet.json"
    hosts = {"box-a": NOWHERE, **{host: {**NOWHERE, **values} for host, (values, _) in BAD.items()}}
    group = {
        "hosts": hosts,
        "vars": {"vllm_service_model_path": "/srv/models/m", "vllm_service_api_key": "sk-1"},
    }
    path.write_text(json.dumps({"all": {"children": {"gpu_boxes": group}}}))
    return path


@pytest.mark.parametrize(
    "workflow", [("deploy.yml",), ("deploy.yml", "--tags", "eagle3"), ("playbooks/ship_drafter.yml",)]
)
def test_a_bad_box_stops_every_box_before_any_is_contacted(fleet, workflow):
    playbook, *args = workflow
    run = run_playbook(playbook, *args, "--limit", "box-a,box-b,box-c", inventory=fleet)
    assert not run.ok, str(run)
    for host, (_, line) in BAD.items():
        assert set(run.failures(host)) == {line}, str(run)
    assert run.failures("box-a") == [
        "not deployed: nothing changes on any box while 2 of 3 boxes fail their inventory checks "
        "(box-b, box-c)"
    ], str(run)
    # Only the checks ran: no box was contacted, and no later play (the transaction, monitoring, the summary).
    assert {r.role for r in run.results} == {"validate_inventory"}, str(run)
    assert all(r.status != "unreachable" for r in run.results), str(run)


def test_limit_narrows_the_checks(fleet):
    """--limit box-a: box-b's and box-c's values are not this run's; box-a passes its checks and its
    transaction starts (it finds the box unreachable, nothing run on it)."""
    run = run_playbook("deploy.yml", "--limit", "box-a", inventory=fleet)
    assert not run.ok, str(run)
    [line] = run.failures("box-a")
    assert line.startswith("box-a is unreachable: ") and line.endswith("; nothing was run on it"), line
    assert not run.select(host="box-a", role="validate_inventory", status="failed"), str(run)
    assert run.hosts() == {"box-a"}, str(run)


# Each play on the GPU boxes with the roles Ansible loaded for it.
READ_ROLES = """
import json, sys
from ansible.parsing.dataloader import DataLoader
from ansible.playbook import Playbook
from ansible.plugins.loader import init_plugin_loader
from ansible.vars.manager import VariableManager

init_plugin_loader()
loader = DataLoader()
playbook = Playbook.load(sys.argv[1], variable_manager=VariableManager(loader=loader), loader=loader)
print(json.dumps([sorted({role.get_name() for role in play.get_roles()}) for play in playbook.get_plays()]))
"""


def test_the_checks_play_loads_the_roles_of_the_transaction():
    """The checks' play imports each role of the transaction's play for its defaults and argument spec: a role
    added to the transaction only would have its values unchecked before the first box changes."""
    read = subprocess.run(
        [sys.executable, "-c", READ_ROLES, "playbooks/common/box.yml"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    assert read.returncode == 0, read.stderr
    checks, transaction = json.loads(read.stdout.strip().splitlines()[-1])
    assert checks == transaction, (checks, transaction)
    assert "validate_inventory" in checks and "vllm_proxy" in checks, checks


def test_a_release_candidate_comes_before_its_release(fleet):
    """PEP 440, as vLLM's releases are numbered: 0.24.0rc1 has no batch-size schedule yet (Ansible's default
    comparison would take it for 0.24.0 or later)."""
    run = run_playbook(
        "deploy.yml",
        "--limit",
        "box-a",
        "-e",
        "vllm_version=0.24.0rc1",
        "-e",
        "spec_tune_output=schedule",
        inventory=fleet,
    )
    assert set(run.failures("box-a")) == {
        "spec_tune_output=schedule needs num_speculative_tokens_per_batch_size, which vLLM has from 0.24.0 "
        "on, not 0.24.0rc1: use spec_tune_output=single (one k) or auto"
    }, str(run)


def test_every_version_test_compares_by_pep440():
    """vLLM's versions are PEP 440's: each `is version(...)` in the plays and roles says so."""
    sources = [
        ROOT / "deploy.yml",
        *ROOT.glob("playbooks/**/*.yml"),
        *ROOT.glob("roles/**/*.yml"),
        *ROOT.glob("roles/**/*.j2"),
    ]
    calls = [
        (path, call) for path in sources for call in re.findall(r"is version\([^)]*\)", path.read_text())
    ]
    assert calls, "no version test found"
    loose = [
        f"{path.relative_to(ROOT)}: {call}" for path, call in calls if "version_type='pep440'" not in call
    ]
    assert not loose, loose


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (
            ("--tags", "spec_tune"),
            "--tags spec_tune serves what is kept and measures nothing: set spec_tune_measure=true to "
            "measure, as playbooks/tune_speculation.yml and playbooks/tune_nccl.yml do",
        ),
        (
            ("--tags", "nccl_tune,spec_tune", "-e", "spec_tune_measure=true"),
            "--tags nccl_tune serves what is kept and measures nothing: set nccl_tune_measure=true to "
            "measure, as playbooks/tune_speculation.yml and playbooks/tune_nccl.yml do",
        ),
        (("--tags", "spec_tune", "-e", "spec_tune_measure=true"), None),
        (
            ("-e", '{"spec_tune_on_deploy": true}'),
            "deprecated until the next release: spec_tune_on_deploy is now spec_tune_measure",
        ),
    ],
)
def test_tags_only_select_and_a_tuner_s_tag_says_how_to_measure(fleet, args, said):
    """A tag never switches a measurement on: --tags spec_tune alone serves what is kept and says so."""
    run = run_playbook("deploy.yml", "--limit", "box-a", *args, inventory=fleet)
    messages = [
        r.result.get("msg")
        for r in run.select(
            host="box-a", role="validate_inventory", action="ansible.builtin.debug", status="ok"
        )
    ]
    assert messages == ([said] if said else []), str(run)


@pytest.mark.parametrize("recheck", [False, True])
def test_one_switch_says_whether_the_transaction_checks_role_arguments_again(fleet, recheck):
    """The checks' play checked every role's arguments at once: the transaction's imports do not again, unless
    specfleet_recheck_role_arguments says so (then Ansible's own check runs as each role starts)."""
    args = ("-e", "specfleet_recheck_role_arguments=true") if recheck else ()
    run = run_playbook("deploy.yml", "--limit", "box-a", *args, inventory=fleet)
    box_plays = run.select(
        host="box-a", action="ansible.builtin.validate_argument_spec", file="playbooks/common/box.yml"
    )
    checked = {r.role for r in box_plays}
    # validate_inventory checks its own as the checks' play starts; rollout's budget is imported without the
    # switch, first in the play. The box is unreachable: the transaction's checks stop at served and reach.
    once = {"validate_inventory", "rollout"}
    assert checked == (once | {"served"} if recheck else once), str(run)
