"""nvidia_cuda: converge.yml run as an operator would, with inventory changes on the command line,
checked by what the role's tasks returned; testinfra (tests/) then checks the box itself.

after_prepare: a --check run on the fresh box (the only moment it is fresh) passes and leaves it
untouched. side_effect: the upgrade to 575.64.03, dry-run then real, with the reboot it skips in a
container; a directory of .debs instead of the repository; then the same box seen as an 8-GPU NVSwitch
board, which gets fabric manager at the driver's version.
"""

from __future__ import annotations

import re

from driver import ROOT

CONVERGE = "molecule/nvidia_cuda/converge.yml"
UPGRADE = ("-e", "nvidia_cuda_driver_version=575.64.03")
ROLE = "nvidia_cuda"
PACKAGES = "nvidia_cuda/tasks/packages.yml"
REPOSITORY = "nvidia_cuda/tasks/repository.yml"
LOCAL_DEBS = "nvidia_cuda/tasks/local_debs.yml"
REBOOT = "nvidia_cuda/tasks/reboot.yml"
SERVICES = "nvidia_cuda/tasks/services.yml"
VERIFY = "nvidia_cuda/tasks/verify.yml"
# The driver metapackage, as packages.yml asks apt for it: open kernel modules, any packaging revision.
OPEN_DRIVER = "nvidia-open-575=575.64.03-*"
FABRIC_MANAGER = "nvidia-fabricmanager-575=575.64.03-*"
SIM_SMI = "/usr/local/share/sim-nvidia-smi"
SIM_PCI = "/usr/local/share/sim-pci"
# The driver the stand-in nvidia-smi package says is loaded (its postinst loads the first one installed).
LOADED_DRIVER = "/run/sim-nvidia/driver-version"
NVSWITCH_BOARD = ROOT / "tests/fixtures/nvidia-smi/h100-8gpu-nvlink-nics"
NVSWITCH_BUS = ROOT / "tests/fixtures/pci-bus/hgx-h100-8gpu-nvswitch"


def args(result: dict) -> dict:
    """The module's arguments as it ran (for a loop, give one item's result)."""
    return result.get("invocation", {}).get("module_args", {})


def report(run, host: str, file: str) -> str:
    """What the role told the operator: the message of the one debug task of `file` that ran."""
    return run.one(host=host, role=ROLE, file=file, action="ansible.builtin.debug").msg


def unheld(run, host: str) -> list[str]:
    """Packages whose hold packages.yml lifted (selection install) because their version changes."""
    return [
        args(item).get("name")
        for result in run.ran(host=host, role=ROLE, file=PACKAGES, action="ansible.builtin.dpkg_selections")
        for item in result.result.get("results", [])
        if args(item).get("selection") == "install" and item.get("changed")
    ]


def apt_install(run, host: str, package: str):
    """The packages.yml apt task that ran with `package` (name=version-*) in its list."""
    found = [
        result
        for result in run.ran(host=host, role=ROLE, file=PACKAGES, action="ansible.builtin.apt")
        if package in (args(result.result).get("package") or [])
    ]
    assert len(found) == 1, f"expected one apt task installing {package}, got {len(found)}\n{run}"
    return found[0]


def source(run, host: str):
    """The deb822 source the role templates (repository.yml)."""
    return run.one(host=host, role=ROLE, file=REPOSITORY, action="ansible.builtin.template")


def fabric_manager_absent(scenario) -> bool:
    return scenario.box.sh("dpkg-query --show nvidia-fabricmanager-575", check=False).returncode != 0


def after_prepare(scenario) -> None:
    """--check on the box as prepare leaves it (no source, no key, no package): apt cannot answer for a
    repository that exists only on paper, so the role says what it would do, and changes nothing."""
    host = scenario.host
    run = scenario.play(CONVERGE, "--check")
    assert run.ok, str(run)
    assert run.changed(host) > 0, str(run)
    would = report(run, host, PACKAGES)
    assert "would configure http://127.0.0.1:8731/debian12/x86_64/, then pin and install" in would, str(run)
    assert "would be installed (check mode)" in report(run, host, VERIFY), str(run)

    # No keyring, source or pin file of the role's, and no NVIDIA package.
    left = scenario.box.out(
        "ls /etc/apt/keyrings /etc/apt/sources.list.d /etc/apt/preferences.d;"
        " dpkg-query --show 'nvidia*' 'cuda*' 2>&1 || true"
    )
    assert "nvidia-cuda" not in left, left
    assert "no packages found matching nvidia" in left, left


def upgrade(scenario) -> None:
    """A new driver version in the inventory: the dry run reports it and moves nothing; the real run
    unholds, installs and holds again, and says the reboot it skips (a container) is needed."""
    host, box = scenario.host, scenario.box
    run = scenario.play(CONVERGE, *UPGRADE, "--check")
    assert run.ok, str(run)
    assert run.changed(host) > 0, str(run)
    assert "nvidia-open-575" in unheld(run, host), str(run)
    would = report(run, host, PACKAGES)
    assert re.search(r"would pin and install .*nvidia-open-575=575\.64\.03", would), str(run)
    assert "driver 575.64.03 would be installed (check mode)" in report(run, host, VERIFY), str(run)
    installed = box.out("dpkg-query --show --showformat='${Version} ${db:Status-Abbrev}' nvidia-open-575")
    assert installed.strip() == "575.57.08-1 hi", installed

    run = scenario.play(CONVERGE, *UPGRADE)
    assert run.ok, str(run)
    assert run.changed(host) > 0, str(run)
    assert "nvidia-open-575" in unheld(run, host), str(run)
    assert apt_install(run, host, OPEN_DRIVER).changed, str(run)
    skipped = (
        f"reboot needed and skipped on {host}: driver 575.64.03 is installed but not loaded"
        " (nvidia_cuda_reboot_allowed is false in a container)"
    )
    assert skipped in report(run, host, REBOOT), str(run)
    not_yet = "not loaded yet: nvidia-smi reports 575.57.08 until the box reboots"
    assert not_yet in report(run, host, VERIFY), str(run)
    reboot = run.select(host=host, role=ROLE, file=REBOOT, action="ansible.builtin.reboot")
    assert reboot and all(r.status == "skipped" for r in reboot), str(run)

    # Until the box reboots, every run says so again, and changes nothing.
    run = scenario.play(CONVERGE, *UPGRADE)
    assert run.ok, str(run)
    assert run.changed(host) == 0, str(run)
    assert "reboot needed and skipped" in report(run, host, REBOOT), str(run)

    assert fabric_manager_absent(scenario), "fabric manager installed on a PCIe box"


def local_debs(scenario) -> None:
    """Air-gapped without a mirror: the same .debs as a directory on the box become the source; the
    packages, already at the inventory's versions, stay."""
    host, box = scenario.host, scenario.box
    if not box.exists("/srv/local-debs"):
        box.sh("mkdir -p /srv/local-debs && cp /srv/cuda-mirror/debian12/x86_64/*.deb /srv/local-debs/")
    run = scenario.play(CONVERGE, *UPGRADE, "-e", "nvidia_cuda_deb_dir=/srv/local-debs")
    assert run.ok, str(run)
    index = run.one(host=host, role=ROLE, file=LOCAL_DEBS, action="ansible.builtin.copy")
    assert index.changed and index.result.get("dest") == "/srv/local-debs/Packages", str(run)
    assert source(run, host).changed, str(run)
    driver = apt_install(run, host, OPEN_DRIVER)
    assert driver.status == "ok" and not driver.changed, str(run)
    assert "driver 575.64.03 installed, held and loaded" in report(run, host, VERIFY), str(run)


def nvswitch(scenario) -> None:
    """The box seen as an 8-GPU NVSwitch board (its PCI bus shows the NVSwitches): fabric manager comes,
    version-locked to the driver, and its service starts; the source goes back from the directory of
    .debs to the signed repository."""
    host, box = scenario.host, scenario.box
    recordings = [(SIM_SMI, NVSWITCH_BOARD, name) for name in ("topo-m.txt", "query-noheader.csv")]
    for directory, fixture, name in [*recordings, (SIM_PCI, NVSWITCH_BUS, "lspci-Dnn.txt")]:
        box.write(f"{directory}/{name}", (fixture / name).read_text())
        box.sh(f"chmod 0644 {directory}/{name}")

    run = scenario.play(CONVERGE, *UPGRADE, "--check")
    assert run.ok, str(run)
    assert run.changed(host) > 0, str(run)
    would = report(run, host, PACKAGES)
    assert re.search(r"pin and install .*nvidia-fabricmanager-575=575\.64\.03", would), str(run)
    assert fabric_manager_absent(scenario), "the dry run installed fabric manager"

    run = scenario.play(CONVERGE, *UPGRADE)
    assert run.ok, str(run)
    assert apt_install(run, host, FABRIC_MANAGER).changed, str(run)
    services = run.ran(host=host, role=ROLE, file=SERVICES, action="ansible.builtin.systemd_service")
    started = [r for r in services if args(r.result).get("name") == "nvidia-fabricmanager"]
    assert len(started) == 1 and started[0].changed, str(run)
    assert "driver 575.64.03 installed, held and loaded" in report(run, host, VERIFY), str(run)
    assert not run.ran(host=host, role=ROLE, file=REBOOT, action="ansible.builtin.debug"), str(run)
    assert not any("reboot needed" in r.msg for r in run.results), str(run)
    assert source(run, host).changed, str(run)


def side_effect(scenario) -> None:
    upgrade(scenario)
    # What a reboot does to the box: the new driver answers, /run is empty again.
    scenario.box.sh(f"echo 575.64.03 > {LOADED_DRIVER} && rm -f /run/nvidia-cuda-reboot-required")
    local_debs(scenario)
    nvswitch(scenario)
