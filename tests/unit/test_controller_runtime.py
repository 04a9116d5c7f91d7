"""A controller for a real fleet needs only requirements-runtime.txt: a virtualenv made from that file alone
(python3 -m venv, as the README's real-fleet section says) parses every workflow and lists its tasks
against inventory/example, with none of the test tools or the simulated box's packages."""

import configparser
import hashlib
import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
CACHE = Path(os.environ.get("SPECFLEET_CACHE") or Path.home() / ".cache/specfleet")
RUNTIME = ROOT / "requirements-runtime.txt"
PLAYBOOKS = ["deploy.yml", *sorted(str(p.relative_to(ROOT)) for p in (ROOT / "playbooks").glob("*.yml"))]
NAME = r"[a-z_][a-z0-9_]*"
FQCN = re.compile(rf"^{NAME}\.{NAME}\.{NAME}$")
# What requirements.txt adds for the tests and the sim, none of which a controller needs.
TEST_ONLY = ["molecule", "pytest", "testinfra", "ansible_lint", "numpy", "tokenizers", "PIL"]


def clean_environment(venv):
    """The environment of an operator's shell with the venv first on PATH: none of the test run's Ansible or
    Python settings (its PYTHONPATH holds the repo, whose molecule/ would import as a package)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ANSIBLE_", "PYTHON", "SPECFLEET_"))}
    return {**env, "PATH": f"{venv / 'bin'}{os.pathsep}{env['PATH']}"}


@pytest.fixture(scope="module")
def runtime_venv():
    """The runtime virtualenv, built once per content of the file (kept in the cache like the test venv)."""
    venv = CACHE / f"runtime-venv-{hashlib.sha256(RUNTIME.read_bytes()).hexdigest()[:16]}"
    if not (venv / ".complete").exists():
        shutil.rmtree(venv, ignore_errors=True)
        subprocess.run(["python3", "-m", "venv", str(venv)], check=True)
        subprocess.run(
            [str(venv / "bin/pip"), "install", "--quiet", "-r", str(RUNTIME)],
            check=True,
            stdin=subprocess.DEVNULL,
        )
        (venv / ".complete").touch()
    return venv


def test_the_runtime_file_holds_no_test_tool(runtime_venv, tmp_path):
    python, env = runtime_venv / "bin/python", clean_environment(runtime_venv)
    # Away from the repo, whose molecule/ directory Python would import as a namespace package.
    imports = [
        subprocess.run([str(python), "-c", f"import {name}"], cwd=tmp_path, env=env) for name in TEST_ONLY
    ]
    found = [name for name, done in zip(TEST_ONLY, imports) if done.returncode == 0]
    assert found == [], f"requirements-runtime.txt installs test tools: {found}"


@pytest.mark.parametrize("playbook", PLAYBOOKS)
def test_every_workflow_parses_against_the_example_inventory(runtime_venv, playbook):
    """--syntax-check, then --list-tasks (every role, task file and collection module resolved)."""
    env = clean_environment(runtime_venv)
    for mode in ("--syntax-check", "--list-tasks"):
        done = subprocess.run(
            [str(runtime_venv / "bin/ansible-playbook"), "-i", "inventory/example", playbook, mode],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            check=False,
        )
        assert done.returncode == 0 and "[WARNING]" not in done.stderr, f"{playbook} {mode}:\n{done.stderr}"
        if mode == "--list-tasks":
            assert "tasks:" in done.stdout or "TAGS:" in done.stdout, done.stdout


def collection_plugins():
    """{plugin type: FQCNs} of every plugin outside ansible.builtin that the workflows use: task actions (a
    task file's keys), Jinja filters, and the callbacks ansible.cfg enables. Tasks in files that are
    included at run time are not resolved by --list-tasks: this finds them all."""
    found = {"module": set(), "filter": set(), "callback": set()}

    def actions(node):
        if isinstance(node, dict):
            for key, value in node.items():
                if isinstance(key, str) and FQCN.match(key):
                    found["module"].add(key)
                actions(value)
        elif isinstance(node, list):
            for item in node:
                actions(item)

    files = [ROOT / "deploy.yml", *ROOT.glob("playbooks/**/*.yml"), *ROOT.glob("roles/*/*/*.yml")]
    for path in files:
        text = path.read_text()
        actions(yaml.safe_load(text))
        # Piped, or named to map() and the like.
        found["filter"].update(re.findall(rf"(?:\|\s*|\(\s*['\"])({NAME}\.{NAME}\.{NAME})", text))
    # An action that runs a collection's action (action_plugins/release_transfer.py: synchronize's).
    for path in ROOT.glob("action_plugins/*.py"):
        found["module"].update(
            re.findall(rf"action_loader\.get\(\s*\"({NAME}\.{NAME}\.{NAME})\"", path.read_text())
        )
    config = configparser.ConfigParser()
    config.read(ROOT / "ansible.cfg")
    found["callback"].update(n.strip() for n in config["defaults"].get("callbacks_enabled", "").split(","))
    return {
        kind: sorted(n for n in names if n and not n.startswith("ansible.builtin."))
        for kind, names in found.items()
    }


def test_every_collection_plugin_the_workflows_use_is_installed(runtime_venv):
    plugins = collection_plugins()
    # The scan finds what the roles are known to use (a scan finding nothing would prove nothing).
    assert {"ansible.posix.synchronize", "community.general.archive"} <= set(plugins["module"]), plugins
    assert plugins["filter"] and plugins["callback"], plugins
    for kind, names in plugins.items():
        done = subprocess.run(
            [str(runtime_venv / "bin/ansible-doc"), "-t", kind, "--json", *names],
            cwd=ROOT,
            env=clean_environment(runtime_venv),
            capture_output=True,
            text=True,
            check=False,
        )
        assert done.returncode == 0 and sorted(json.loads(done.stdout)) == names, f"{kind}: {done.stderr}"
