"""Drafters shipped with `--tags eagle3` as a user would (from the controller, from a path on the
box, over HTTP; then a corrupted one), checked on the runs' structured results; testinfra (tests/)
then checks the box itself."""

import hashlib
import shutil
import subprocess
import tempfile
from pathlib import Path

from driver import ROOT

MODELS = ROOT / "build/sim-models"
DRAFTERS = "/srv/drafters"
SHIP = ("--tags", "eagle3", "-e")
RESTART = {"role": "vllm_service", "file": "vllm_service/handlers/main.yml", "action": "systemd_service"}


def restarted(run, host):
    return any(result.changed for result in run.ran(host=host, **RESTART))


def switched(run, host):
    """The results of the switch of `current` to a release (eagle3_drafter/tasks/switch.yml)."""
    return [
        result
        for result in run.ran(host=host, role="eagle3_drafter", file="eagle3_drafter/tasks/switch.yml")
        if result.result.get("dest", "").endswith("/current")
        or result.result.get("path", "").endswith("/current")
    ]


def staged_copy(run, host):
    """The copy of incoming/ into releases/<id>.partial: skipped when the release already exists."""
    return run.select(
        host=host, role="eagle3_drafter", file="eagle3_drafter/tasks/stage_incoming.yml", action="copy"
    )


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

    # A new release, another accepting drafter: only drafter, service and gate tasks run.
    new = scenario.play("deploy.yml", *SHIP, f"eagle3_drafter_source={MODELS / 'eagle3-known-3.0'}")
    assert new.ok and new.changed(host) > 0, str(new)
    assert restarted(new, host), str(new)
    assert any(result.changed for result in switched(new, host)), str(new)
    # The vllm role contributes nothing but its (always-on) argument check.
    installs = [
        r for r in new.ran(host=host, role="vllm") if r.action != "ansible.builtin.validate_argument_spec"
    ]
    assert not installs, [(r.file, r.action) for r in installs]

    again = scenario.play("deploy.yml", *SHIP, f"eagle3_drafter_source={MODELS / 'eagle3-known-3.0'}")
    assert again.ok and again.changed(host) == 0, str(again)

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
    files = {
        name: hashlib.sha256((MODELS / "eagle3-known-3.0" / name).read_bytes()).hexdigest()
        for name in ("config.json", "model.safetensors")
    }
    http = scenario.play(
        "deploy.yml",
        "--tags",
        "eagle3",
        extra_vars={
            "eagle3_drafter_source_kind": "http",
            "eagle3_drafter_source": "http://127.0.0.1:8765",
            "eagle3_drafter_http_files": files,
        },
    )
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
