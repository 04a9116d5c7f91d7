"""Unit tests for library/dkms_status.py on real `dkms status` output (tests/fixtures/dkms/SOURCES.md)."""

import pathlib

import dkms_status
import pytest

DKMS = pathlib.Path(__file__).resolve().parent.parent / "fixtures" / "dkms"
KERNEL_A, KERNEL_B, KERNEL_C = "6.1.0-50-amd64", "6.1.0-57-amd64", "6.12.118+deb12-amd64"


def entries(name):
    return dkms_status.parse_status((DKMS / name).read_text())


def test_installed_lines():
    assert entries("status-installed-both.txt") == [
        {
            "module": "specfleet-dummy",
            "version": "1.0",
            "kernel": k,
            "arch": "x86_64",
            "state": "installed",
            "note": "",
        }
        for k in (KERNEL_A, KERNEL_B)
    ]


def test_added_line_has_no_kernel():
    assert entries("status-two-modules-nvidia-added.txt")[0] == {
        "module": "nvidia",
        "version": "575.57.08",
        "kernel": "",
        "arch": "",
        "state": "added",
        "note": "",
    }


def test_stderr_noise_merged_into_stdout_is_left_out():
    # `dkms status 2>&1` on a box with the 6.12 headers: four readelf warnings before the status lines.
    assert entries("status-three-kernels-merged.txt") == entries("status-three-kernels.txt")
    assert len(entries("status-three-kernels.txt")) == 6


def test_dkms_2_comma_format():
    # dkms 2.x (Ubuntu 22.04) as a user's console printed it in a public issue.
    assert dkms_status.parse_status("nvidia, 535.129.03, 5.13.0-44-generic, x86_64: installed\n") == [
        {
            "module": "nvidia",
            "version": "535.129.03",
            "kernel": "5.13.0-44-generic",
            "arch": "x86_64",
            "state": "installed",
            "note": "",
        }
    ]


def test_module_missing_for_the_kernel_the_box_boots_next():
    # nvidia installed for kernel A only, while B's headers (and here its image) are there: B has no line.
    facts = dkms_status.summarize(
        entries("status-two-modules.txt"), "nvidia", [KERNEL_A, KERNEL_B], KERNEL_B, "x"
    )
    assert facts["versions"] == ["575.57.08"]
    assert facts["kernels_without_module"] == [KERNEL_B]
    assert facts["missing_for_next_kernel"] is True
    # The dummy module is installed for both.
    both = dkms_status.summarize(
        entries("status-two-modules.txt"), "specfleet-dummy", [KERNEL_A, KERNEL_B], KERNEL_B, ""
    )
    assert both["missing_for_next_kernel"] is False and both["kernels_without_module"] == []


def test_new_kernel_image_without_headers(tmp_path):
    """Kernel C's image came without headers; /vmlinuz points at it; dkms skipped it."""
    boot = tmp_path / "boot"
    boot.mkdir()
    for line in (DKMS / "ls-boot-after-kernel-C.txt").read_text().splitlines():
        name = line.split()[-1]
        if name.startswith(("vmlinuz-", "initrd.img-", "config-", "System.map-")):
            (boot / name).write_text("")
    vmlinuz = tmp_path / "vmlinuz"
    vmlinuz.symlink_to((DKMS / "readlink-vmlinuz.txt").read_text().strip())
    kernels = dkms_status.installed_kernels(str(boot))
    assert kernels == [KERNEL_C]
    following = dkms_status.next_kernel(kernels, links=(str(vmlinuz),))
    assert following == KERNEL_C
    facts = dkms_status.summarize(
        entries("status-next-kernel-image-no-headers.txt"), "nvidia", kernels, following, ""
    )
    assert facts["missing_for_next_kernel"] is True
    # Once its headers came, the postinst hook built it.
    facts = dkms_status.summarize(entries("status-three-kernels.txt"), "nvidia", kernels, following, "")
    assert facts["missing_for_next_kernel"] is False


def test_next_kernel_without_a_link_is_the_newest():
    kernels = sorted([KERNEL_C, KERNEL_B, KERNEL_A], key=dkms_status.release_key)
    assert kernels == [KERNEL_A, KERNEL_B, KERNEL_C]
    assert dkms_status.next_kernel(kernels, links=()) == KERNEL_C


def test_a_module_dkms_does_not_know_is_not_missing():
    facts = dkms_status.summarize(entries("status-empty.txt"), "nvidia", [KERNEL_A], KERNEL_A, KERNEL_A)
    assert facts["versions"] == [] and facts["missing_for_next_kernel"] is False


@pytest.mark.parametrize("name", ["status-after-failed-build.txt", "status-source-tree-deleted.txt"])
def test_every_status_line_of_the_fixtures_parses(name):
    lines = [line for line in (DKMS / name).read_text().splitlines() if line.strip()]
    assert len(entries(name)) == len(lines)


def test_module_on_a_box_without_dkms(run_module, monkeypatch):
    monkeypatch.setenv("PATH", "/nonexistent")
    result = run_module(dkms_status, {})
    assert result["ansible_facts"]["dkms_status"] == {"available": False}
