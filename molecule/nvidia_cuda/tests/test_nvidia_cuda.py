"""After side_effect: driver 575.64.03 (upgraded from 575.57.08) and CUDA 12.9.1 from the signed
stand-in repository, pinned and held; the box is now an NVSwitch board with fabric manager."""

import pytest

DRIVER = "575.64.03-1"
HELD = {
    "nvidia-open-575": DRIVER,
    "nvidia-persistenced": DRIVER,
    "nvidia-fabricmanager-575": DRIVER,
    "libnvidia-nscq-575": DRIVER,
    "cuda-toolkit-12-9": "12.9.1-1",
}
PREFERENCES = "/etc/apt/preferences.d/nvidia-cuda.pref"
SOURCES = "/etc/apt/sources.list.d/nvidia-cuda.sources"
KEYRING = "/etc/apt/keyrings/nvidia-cuda.asc"


def test_packages_installed_at_the_inventory_versions_and_held(host):
    selections = dict(line.split() for line in host.check_output("dpkg --get-selections").splitlines())
    for name, version in HELD.items():
        assert host.package(name).version == version, name
        assert selections[name] == "hold", name
    # Pulled in by the driver metapackage: not held, kept at the driver's version by the pin.
    assert host.package("libnvidia-ml1").version == DRIVER
    assert host.package("cuda-drivers-575").is_installed is False


def test_pin_file_pins_each_package_to_its_exact_version(host):
    pref = host.file(PREFERENCES)
    assert pref.mode == 0o644 and pref.user == "root"
    content = pref.content_string
    assert content.startswith("#") and "Ansible managed" in content
    for name, version in HELD.items():
        upstream = version.rsplit("-", 1)[0]
        assert f"Package: {name}\nPin: version {upstream}-*\nPin-Priority: 1001" in content, name
    assert "575.57.08" not in content


@pytest.mark.parametrize("name", ["nvidia-open-575", "libnvidia-ml1", "nvidia-fabricmanager-575"])
def test_pin_wins_over_the_newer_driver_in_the_repository(host, name):
    policy = host.check_output(f"apt-cache policy {name}")
    assert "575.64.05-1" in policy  # newer, available...
    assert f"Candidate: {DRIVER}" in policy  # ...and never the candidate
    assert "*** 575.64.03-1 1001" in policy


def test_nothing_nvidia_moves_on_upgrade(host):
    simulated = host.check_output("apt-get --simulate dist-upgrade")
    assert "Inst " not in simulated, simulated


def test_source_is_signed_by_its_own_keyring(host):
    source = host.file(SOURCES)
    assert source.mode == 0o644
    content = source.content_string
    assert "URIs: http://127.0.0.1:8731/debian12/x86_64/\n" in content
    assert "Suites: /\n" in content
    assert f"Signed-By: {KEYRING}\n" in content
    assert "Trusted" not in content
    keyring = host.file(KEYRING)
    assert keyring.mode == 0o644 and keyring.user == "root"
    assert keyring.content_string.startswith("-----BEGIN PGP PUBLIC KEY BLOCK-----")
    # No apt-key: nothing in the legacy trusted keyrings.
    assert not host.file("/etc/apt/trusted.gpg").exists
    # The signature was checked: apt keeps the InRelease it verified.
    lists = host.check_output("ls /var/lib/apt/lists")
    assert "127.0.0.1:8731_debian12_x86%5f64_InRelease" in lists, lists


def test_kernel_headers_for_the_running_kernel(host):
    assert host.package(f"linux-headers-{host.check_output('uname -r')}").is_installed


@pytest.mark.parametrize("unit", ["nvidia-persistenced", "nvidia-fabricmanager"])
def test_services_enabled_and_running(host, unit):
    service = host.service(unit)
    assert service.is_enabled
    assert service.is_running


def test_fabricmanager_runs_the_driver_version(host):
    unit = host.check_output("systemctl show --property=Description nvidia-fabricmanager")
    assert "575.64.03-1" in unit


def test_no_reboot_pending(host):
    assert not host.file("/run/nvidia-cuda-reboot-required").exists
    assert (
        host.check_output("nvidia-smi --query-gpu=driver_version --format=csv,noheader").splitlines()
        == ["575.64.03"] * 8
    )
