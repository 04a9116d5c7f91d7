"""The one scenario driver: runs ansible-playbook and reads its results as JSON.

Every scenario and the preflight tests use it. Tests select results by what a task *is* — the
host, the role, the file the task lives in, the module it runs — and assert on what it returned
(changed, msg, facts), never on the text of task names, which stay free to change.

Each run writes its results through tests/callback_plugins/results.py (a line per task result, then
the recap), beside ansible's own screen output, and keeps the modules it builds for the next run
(tests/callback_plugins/ansiballz_cache.py).

A molecule scenario is run step by step (`Scenario.test`) in the order of its `test_sequence`:
molecule creates, prepares, verifies and destroys the box; syntax, converge, idempotence and
check run here, read as structured results; and at the `side_effect` step the scenario's Python side effect
(`molecule/<name>/side_effect.py`, a function `side_effect(scenario)`, plus optional
`after_<step>(scenario)` checks, e.g. `after_prepare` on the fresh box), which drives playbooks
through this driver.
"""

from __future__ import annotations

import contextlib
import datetime
import hashlib
import importlib.util
import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import ansible
import yaml
from vllm_wheels import CACHE

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
SECOND_BOX = "zz-second-box"
REACH_CHECK = "roles/rollout/tasks/reach.yml"
# Actions that run on the controller alone (controller_file, chat_workload, role_arguments: action_plugins/).
CONTROLLER_ACTIONS = {
    "controller_file",
    "chat_workload",
    "role_arguments",
    *(
        f"ansible.builtin.{name}"
        for name in (
            "set_fact",
            "validate_argument_spec",
            "debug",
            "fail",
            "assert",
            "meta",
            "include_tasks",
            "include_role",
        )
    ),
}


def _ansiballz_cache() -> Path:
    """Where the runs keep the modules they build (tests/callback_plugins/ansiballz_cache.py): named after
    what a built module holds, ansible and its collections (the virtualenv, one per requirements.txt,
    that every clone links) and the repo's modules. Caches no suite started from for a week go."""
    digest = hashlib.sha256(f"{Path(sys.prefix).resolve()} {ansible.__version__}".encode())
    for path in sorted((*ROOT.glob("library/**/*"), *ROOT.glob("module_utils/**/*"))):
        if path.is_file() and "__pycache__" not in path.parts:
            digest.update(f"{path.relative_to(ROOT)}\0".encode() + path.read_bytes())
    caches = CACHE / "ansiballz"
    for old in caches.glob("*"):
        with contextlib.suppress(FileNotFoundError):  # another pytest worker pruned it first
            if time.time() - old.stat().st_mtime > 7 * 86400:
                shutil.rmtree(old, ignore_errors=True)
    cache = caches / digest.hexdigest()[:16]
    cache.mkdir(parents=True, exist_ok=True)
    os.utime(cache)  # in use: kept
    return cache


ANSIBALLZ_CACHE = _ansiballz_cache()


@dataclass(frozen=True, eq=False)  # one result is one event: identity, not equal fields
class TaskResult:
    """One task's result on one host, as tests/callback_plugins/results.py wrote it."""

    host: str
    status: str  # ok, failed, skipped, unreachable
    role: str | None
    action: str  # the module, fully qualified
    file: str  # the task's file, relative to the repo root where it lies inside it
    handler: bool
    ignored: bool
    result: dict = field(repr=False)
    name: str = field(default="", compare=False)  # for messages only: never select on it
    ended: float = field(default=0.0, compare=False)  # time.time() when the result came

    @property
    def changed(self) -> bool:
        return bool(self.result.get("changed"))

    @property
    def msg(self) -> str:
        msg = self.result.get("msg", "")
        return msg if isinstance(msg, str) else json.dumps(msg)

    @property
    def facts(self) -> dict:
        return self.result.get("ansible_facts", {})

    @property
    def delegated_to_controller(self) -> bool:
        """Run on the controller for the box (delegate_to: localhost)."""
        return self.result.get("_ansible_delegated_vars", {}).get("ansible_connection") == "local"


def _relative(task_path: str) -> str:
    path = Path(task_path.rsplit(":", 1)[0])
    try:
        return str(path.resolve().relative_to(ROOT))
    except ValueError:
        return str(path)


class Run:
    """What one ansible-playbook run did: exit code, per-host recap, every task result."""

    def __init__(self, argv: list[str], rc: int, stdout: str, lines: list[dict]) -> None:
        self.argv = argv
        self.rc = rc
        self.stdout = stdout
        recaps = [line["recap"] for line in lines if "recap" in line]
        self.stats = recaps[-1] if recaps else {}
        self.results: list[TaskResult] = []
        for line in lines:
            if "recap" in line or not line["path"]:
                continue
            file = _relative(line["path"])
            self.results.append(
                TaskResult(
                    host=line["host"],
                    status=line["status"],
                    role=line["role"],
                    action=line["action"],
                    file=file,
                    handler="/handlers/" in f"/{file}",
                    # An unreachable result carries no ignore flag: roles/rollout's reach check ignores its
                    # own failure and says it again in the box's one line.
                    ignored=line["ignored"] or file == REACH_CHECK,
                    result=line["res"],
                    name=line["name"],
                    ended=line["ended"],
                )
            )

    @property
    def ok(self) -> bool:
        return self.rc == 0

    def recap(self, host: str) -> dict:
        """ok / changed / failures / unreachable / skipped / rescued / ignored counts for a host."""
        return {key: counts.get(host, 0) for key, counts in self.stats.items() if isinstance(counts, dict)}

    def changed(self, host: str | None = None) -> int:
        counts = self.stats.get("changed", {})
        return counts.get(host, 0) if host else sum(counts.values())

    def hosts(self) -> set[str]:
        """Hosts the play reached (any task result, skipped included)."""
        return {result.host for result in self.results}

    def touched(self, host: str) -> bool:
        """Whether anything ran on the box: a task that ran with an action that reaches it (roles/rollout's
        budget check and summary, and roles/served, only set facts on the controller; a reach
        check that failed ran nothing; a module delegated to the controller reads the controller's files)."""
        return any(
            r.action not in CONTROLLER_ACTIONS
            and not r.delegated_to_controller
            and not (r.file == REACH_CHECK and r.status != "ok")
            for r in self.ran(host=host)
        )

    def select(self, *, host=None, role=None, file=None, action=None, status=None, handler=None):
        """Results matching every given field; file matches by its end ('eagle3_drafter/tasks/switch.yml')."""
        wanted = {status} if isinstance(status, str) else status
        return [
            r
            for r in self.results
            if (host is None or r.host == host)
            and (role is None or r.role == role)
            and (file is None or r.file.endswith(file))
            and (action is None or r.action == action or r.action.endswith("." + action))
            and (wanted is None or r.status in wanted)
            and (handler is None or r.handler == handler)
        ]

    def ran(self, **match) -> list[TaskResult]:
        """Results of tasks that ran (not skipped)."""
        return [r for r in self.select(**match) if r.status != "skipped"]

    def changed_results(self, **match) -> list[TaskResult]:
        return [r for r in self.ran(**match) if r.changed]

    def one(self, **match) -> TaskResult:
        """The single result that ran and matches; fails the test otherwise."""
        found = self.ran(**match)
        assert len(found) == 1, f"expected one result for {match}, got {len(found)}\n{self}"
        return found[0]

    def failures(self, host: str | None = None) -> list[str]:
        """The messages of failed (not ignored) and unreachable results; of a loop, its failed items'. A box's
        line repeated by the run's summary (roles/rollout) is listed once."""
        messages = []
        for r in self.results:
            if r.status in ("failed", "unreachable") and not r.ignored and (host is None or r.host == host):
                items = [item for item in r.result.get("results", []) if item.get("failed")]
                for message in [str(item.get("msg", "")) for item in items] or [r.msg]:
                    if not (r.role == "rollout" and message in messages):
                        messages.append(message)
        return messages

    def __str__(self) -> str:
        tail = "\n".join(self.stdout.splitlines()[-60:])
        # The failures last: a truncated report (CI keeps a run's head and tail) still shows them.
        return (
            f"$ {shlex.join(self.argv)}\nrc={self.rc} recap={json.dumps(self.stats.get('changed', {}))}\n"
            f"--- last lines of the output ---\n{tail}\n--- failures ---\n{self.failures()}"
        )


def run_playbook(playbook, *args, inventory=None, extra_vars=None) -> Run:
    """ansible-playbook PLAYBOOK ARGS... from the repo root; its results read as JSON.

    args are ansible-playbook's own (`--tags`, `--check`, `-e key=value` as a user types them);
    extra_vars (a dict) go as one JSON `-e`, typed.
    """
    cmdline = list(args)
    for path in [inventory] if isinstance(inventory, (str, Path)) else inventory or []:
        cmdline += ["-i", str(path)]
    if extra_vars:
        cmdline += ["-e", json.dumps(extra_vars)]
    # The venv's ansible-playbook, whatever PATH the tests were started with.
    argv = [str(BIN / "ansible-playbook"), str(ROOT / playbook), *cmdline]
    with tempfile.NamedTemporaryFile(prefix="specfleet-results-", suffix=".jsonl") as results:
        finished = subprocess.run(
            argv,
            cwd=ROOT,
            env={
                **os.environ,
                "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}",
                # The tests' own callbacks, beside the repo's (ansible.cfg's path, which this replaces).
                "ANSIBLE_CALLBACK_PLUGINS": os.pathsep.join(
                    [str(ROOT / "tests/callback_plugins"), str(ROOT / "callback_plugins")]
                ),
                "SPECFLEET_RESULTS": results.name,
                "SPECFLEET_ANSIBALLZ_CACHE": str(ANSIBALLZ_CACHE),
            },
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            check=False,
        )
        lines = [json.loads(line) for line in Path(results.name).read_text().splitlines()]
    return Run(argv, finished.returncode, finished.stdout, lines)


def podman(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(["podman", *args], capture_output=True, text=True, check=check)


# The user sim/roles/sim_box authorizes the controller's key for (its default).
SIM_SSH_USER = yaml.safe_load((ROOT / "sim/roles/sim_box/defaults/main.yml").read_text())["sim_box_ssh_user"]


def ssh_connection(container: str) -> dict:
    """How deploy.yml reaches a prepared sim box, as it reaches a fleet's boxes: over SSH, on the loopback
    port podman published for its sshd, as the user sim_box set up."""
    published = podman("port", container, "22/tcp").stdout.split()[0]  # 127.0.0.1:PORT
    port = int(published.rsplit(":", 1)[1])
    return {
        "ansible_connection": "ssh",
        "ansible_host": "127.0.0.1",
        "ansible_port": port,
        "ansible_user": SIM_SSH_USER,
    }


def ssh_inventory(path: Path, host: str, container: str) -> Path:
    """An inventory file that reaches a prepared sim box over SSH (pipelining and become as configured;
    the key and known_hosts come from inventory/local's group_vars)."""
    path.write_text(json.dumps({"all": {"hosts": {host: ssh_connection(container)}}}))
    return path


# The sim's SSH key and pinned host key (inventory/local's group_vars), for inventories without them.
SIM_SSH = {
    key: value
    for key, value in yaml.safe_load((ROOT / "inventory/local/group_vars/sim_boxes.yml").read_text()).items()
    if key in ("sim_ssh_dir", "ansible_ssh_private_key_file", "ansible_ssh_common_args")
}


def profile_inventory(directory: Path, profile: Path, boxes: dict[str, str], overrides: dict) -> Path:
    """An inventory of sim boxes named as a profile's hosts (host -> container): the profile's group_vars and
    host_vars as written, and above them the sim's overrides, in each box's host_vars after the profile's
    (files of a host's directory are read in name order). Only the connection comes from here."""
    directory.mkdir(parents=True)
    (directory / "group_vars").symlink_to(profile / "group_vars")
    hosts = {}
    for host, container in boxes.items():
        hosts[host] = ssh_connection(container)
        own = directory / "host_vars" / host
        own.mkdir(parents=True)
        if (profile / "host_vars" / f"{host}.yml").exists():
            (own / "profile.yml").symlink_to(profile / "host_vars" / f"{host}.yml")
        (own / "sim-overrides.yml").write_text(json.dumps(overrides))
    inventory = {"all": {"children": {"gpu_boxes": {"vars": SIM_SSH, "hosts": hosts}}}}
    (directory / "hosts.json").write_text(json.dumps(inventory))
    return directory


class Box:
    """A simulated GPU box container, seen from the controller."""

    def __init__(self, container: str) -> None:
        self.container = container

    def sh(self, command: str, check: bool = True) -> subprocess.CompletedProcess:
        result = podman("exec", self.container, "sh", "-c", command, check=False)
        assert not check or result.returncode == 0, f"{command}: {result.stdout}{result.stderr}"
        return result

    def out(self, command: str) -> str:
        return self.sh(command).stdout

    def exists(self, path: str) -> bool:
        return self.sh(f"test -e {shlex.quote(path)}", check=False).returncode == 0

    def write(self, path: str, content: str) -> None:
        subprocess.run(
            ["podman", "exec", "-i", self.container, "sh", "-c", f"cat > {shlex.quote(path)}"],
            input=content,
            text=True,
            check=True,
        )


class Scenario:
    """A molecule scenario run step by step, with its side effect in Python.

    molecule creates, prepares, verifies (testinfra) and destroys the box; the playbook steps
    (syntax, converge, idempotence, check) run here through run_playbook, with the same playbook
    and inventory molecule would use, so that their checks read structured results too.
    """

    def __init__(self, name: str, workdir: Path) -> None:
        self.name = name
        self.directory = ROOT / "molecule" / name
        self.workdir = workdir
        base = yaml.safe_load((ROOT / ".config/molecule/config.yml").read_text())
        config = yaml.safe_load((self.directory / "molecule.yml").read_text())
        self.sequence = config["scenario"]["test_sequence"]
        playbooks = {
            **base["provisioner"]["playbooks"],
            **config.get("provisioner", {}).get("playbooks", {}),
        }
        converge = playbooks["converge"].replace("${MOLECULE_PROJECT_DIRECTORY}", str(ROOT))
        self.converge_playbook = self.directory / converge  # an absolute path stays itself
        containers = [
            platform["name"].replace("${MOLECULE_SCENARIO_NAME}", name)
            for platform in config.get("platforms", base["platforms"])
        ]
        # A scenario with molecule/<name>/sim_overrides.yml deploys a profile (an inventory's group_vars and
        # host_vars) onto boxes named as its hosts (specfleet-<name>-<host>); the others, one box each, are
        # named as their containers in molecule's inventory.
        overrides = self.directory / "sim_overrides.yml"
        self.profile = yaml.safe_load(overrides.read_text()) if overrides.exists() else None
        prefix = f"specfleet-{name}-" if self.profile else ""
        self.boxes = {container.removeprefix(prefix): Box(container) for container in containers}
        self.box = next(iter(self.boxes.values()))  # the first (a one-box scenario's box)
        self.env = {
            **os.environ,
            "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}",
            "MOLECULE_EPHEMERAL_DIRECTORY": str(workdir / "molecule"),
        }
        self.minutes: dict[str, float] = {}
        # The runs of the playbook steps (converge, idempotence, check), for the side effect to read.
        self.runs: dict[str, Run] = {}
        # Each play's seconds and command line, for the slowest ones in the summary (tests/conftest.py).
        self.plays: list[tuple[float, str]] = []
        # The model loads the boxes timed while this scenario ran (count_loads), for the summary too.
        self.created_at = ""
        self.loads = {"count": 0, "seconds": 0.0}

    @property
    def inventory(self) -> Path:
        return self.workdir / "molecule" / "inventory"

    @property
    def ssh_inventory(self) -> Path:
        """Written once the box exists (after create): molecule's own steps keep podman."""
        return self.workdir / "ssh-inventory.json"

    @property
    def host(self) -> str:
        """The first box's inventory name (a one-box scenario's: its name in molecule's inventory)."""
        return next(iter(self.boxes))

    @property
    def profile_inventory(self) -> Path:
        """A profile scenario's inventory (written after create)."""
        return self.workdir / "profile-inventory"

    @property
    def second_box_inventory(self) -> Path:
        """A second box later in the rollout, never created: a run that fails this scenario's box must
        stop before reaching it (serial 1, max_fail_percentage 0). A sim box as the first, so that its
        values pass the inventory's checks, which every box's pass before any box changes."""
        path = self.workdir / "second-box.json"
        never = f"{self.box.container}-never-created"
        box = {"ansible_connection": "containers.podman.podman", "ansible_host": never}
        sim = {"sim_boxes": {"hosts": {SECOND_BOX: box}}}
        hosts = {"all": {"children": {"gpu_boxes": {"children": sim}}}}
        path.write_text(json.dumps(hosts))
        return path

    def molecule(self, step: str) -> None:
        log = self.workdir / f"molecule-{step}.log"
        with log.open("w") as out:
            result = subprocess.run(
                [str(BIN / "molecule"), step, "--scenario-name", self.name],
                cwd=ROOT,
                env=self.env,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                check=False,
            )
        tail = "\n".join(log.read_text().splitlines()[-80:])
        assert result.returncode == 0, f"molecule {step} -s {self.name} failed ({result.returncode}):\n{tail}"

    def play(self, playbook="deploy.yml", *args, **kwargs) -> Run:
        """A playbook against this scenario's box(es) over SSH: molecule's inventory, the SSH
        connection of the box, and any other inventory given."""
        extra = kwargs.pop("inventory", None)
        own = [self.profile_inventory] if self.profile else [self.inventory, self.ssh_inventory]
        inventories = [*own, *([extra] if extra else [])]
        started = time.monotonic()
        try:
            return run_playbook(playbook, *args, inventory=inventories, **kwargs)
        finally:
            line = shlex.join(
                [
                    Path(playbook).name,
                    *args,
                    *(["-e", json.dumps(kwargs["extra_vars"])] if kwargs.get("extra_vars") else []),
                ]
            )
            self.plays.append((time.monotonic() - started, line))

    def slowest_plays(self, count: int = 3) -> list[tuple[float, str]]:
        return sorted(self.plays, reverse=True)[:count]

    def count_loads(self) -> None:
        """The model loads every box timed since this scenario created it (roles/vllm_service's loads.json,
        serving and trial units): the suite's cost, counted as the product counts it."""
        for box in self.boxes.values():
            kept = box.sh("cat /var/lib/specfleet/loads/loads.json", check=False)
            if kept.returncode != 0:
                continue
            for load in json.loads(kept.stdout).get("loads", []):
                if load["started_at"] >= self.created_at:
                    self.loads["count"] += 1
                    self.loads["seconds"] += load["seconds"] or 0.0

    def syntax(self) -> None:
        inventory = ROOT / (self.profile["profile"] if self.profile else "inventory/local")
        run = run_playbook(self.converge_playbook, "--syntax-check", inventory=inventory)
        assert run.ok, str(run)

    def converge(self) -> None:
        run = self.runs["converge"] = self.play(self.converge_playbook)
        assert run.ok, str(run)

    def idempotence(self) -> None:
        run = self.runs["idempotence"] = self.play(self.converge_playbook)
        changed = [(r.host, r.role, r.file, r.action) for r in run.changed_results()]
        assert run.ok and run.changed() == 0, f"not idempotent, changed: {changed}\n{run}"

    def check(self) -> None:
        run = self.runs["check"] = self.play(self.converge_playbook, "--check")
        assert run.ok, str(run)

    def _python_steps(self):
        """molecule/<name>/side_effect.py: side_effect(scenario), and after_<step>(scenario) hooks."""
        path = self.directory / "side_effect.py"
        if not path.exists():
            return None
        spec = importlib.util.spec_from_file_location(f"side_effect_{self.name}", path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module

    def test(self) -> None:
        """molecule's test sequence, the Python side effect at its place; destroy whatever happens."""
        python = self._python_steps()
        own = {
            "syntax": self.syntax,
            "converge": self.converge,
            "idempotence": self.idempotence,
            "check": self.check,
            "side_effect": lambda: python.side_effect(self),
        }
        finished = False
        try:
            for step in self.sequence:
                started = time.monotonic()
                if step == "create":
                    self.created_at = datetime.datetime.now(datetime.timezone.utc).isoformat(
                        timespec="seconds"
                    )
                if step == "destroy":
                    self.count_loads()
                if step in own:
                    own[step]()
                else:
                    self.molecule(step)
                if step == "create":
                    # Booted before anything reaches them (without prepare, converge comes next).
                    for box in self.boxes.values():
                        box.sh("systemctl is-system-running --wait >/dev/null", check=False)
                    if self.profile:
                        profile_inventory(
                            self.profile_inventory,
                            ROOT / self.profile["profile"],
                            {host: box.container for host, box in self.boxes.items()},
                            {key: entry["value"] for key, entry in self.profile["overrides"].items()},
                        )
                    else:
                        ssh_inventory(self.ssh_inventory, self.host, self.box.container)
                hook = getattr(python, f"after_{step}", None)
                if hook:
                    hook(self)
                self.minutes[step] = self.minutes.get(step, 0) + (time.monotonic() - started) / 60
            finished = self.sequence[-1] == "destroy"
        finally:
            if not finished:
                if self.created_at:
                    self.count_loads()
                self.molecule("destroy")
