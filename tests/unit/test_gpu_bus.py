"""Unit tests for library/gpu_bus.py against real PCI bus listings (tests/fixtures/pci-bus/SOURCES.md)."""

import pathlib
import stat

import gpu_bus
import pytest

FIXTURES = pathlib.Path(__file__).resolve().parent.parent / "fixtures"


def lspci_facts(box):
    return gpu_bus.classify(
        gpu_bus.parse_lspci((FIXTURES / "pci-bus" / box / "lspci-Dnn.txt").read_text()), "lspci"
    )


def test_hgx_board_has_eight_gpus_and_needs_fabric_manager():
    facts = lspci_facts("hgx-h100-8gpu-nvswitch")
    assert facts["gpu_count"] == 8
    assert {gpu["name"] for gpu in facts["gpus"]} == {"H100 SXM5 80GB"}
    assert {gpu["chip"] for gpu in facts["gpus"]} == {"GH100"}
    assert [gpu["address"] for gpu in facts["gpus"]][:2] == ["0000:1b:00.0", "0000:43:00.0"]
    assert [switch["device_id"] for switch in facts["nvswitches"]] == ["22a3"] * 4
    assert facts["fabric_manager"] is True
    assert facts["kernel_modules"] == "open"
    # The BMC's ASPEED VGA controller is neither a GPU nor an NVIDIA function.
    assert facts["other_functions"] == []


def test_consumer_cards_audio_functions_are_not_gpus():
    facts = lspci_facts("rtx4090-8gpu-pcie")
    assert facts["gpu_count"] == 8
    assert {gpu["class"] for gpu in facts["gpus"]} == {"0300"}
    assert len(facts["other_functions"]) == 8
    assert {other["class"] for other in facts["other_functions"]} == {"0403"}
    assert facts["nvswitches"] == [] and facts["fabric_manager"] is False
    assert facts["gpus"][0] == {
        "address": "0000:01:00.0",
        "device_id": "2684",
        "class": "0300",
        "chip": "AD102",
        "name": "GeForce RTX 4090",
    }


def sysfs_tree(tmp_path, listing):
    """A /sys/bus/pci/devices tree holding the vendor, device and class files of a real listing."""
    for line in listing.splitlines():
        address, vendor, device, pci_class = line.split()
        directory = tmp_path / address
        directory.mkdir()
        for attribute, value in (("vendor", vendor), ("device", device), ("class", pci_class)):
            (directory / attribute).write_text(value + "\n")
    return tmp_path


def test_sysfs_of_a_real_h200_vm(tmp_path):
    listing = (FIXTURES / "nvidia-smi-q/h200-pcie-vm/sysfs-pci.txt").read_text()
    facts = gpu_bus.classify(gpu_bus.read_sysfs(sysfs_tree(tmp_path, listing), names={}), "sysfs")
    assert facts["gpu_count"] == 1
    assert facts["gpus"] == [
        {"address": "0000:00:06.0", "device_id": "2335", "class": "0302", "chip": "", "name": "device 2335"}
    ]
    assert facts["kernel_modules"] == "open"


def test_sysfs_names_come_from_pci_ids(tmp_path):
    pci_ids = tmp_path / "pci.ids"
    # The layout of the pci.ids database: vendor lines, tab-indented devices, two tabs for subsystems.
    pci_ids.write_text(
        "10de  NVIDIA Corporation\n\t2335  GH100 [H200]\n\t\t10de 18be  H200 NVL\n"
        "1af4  Red Hat, Inc.\n\t1000  Virtio\n"
    )
    names = gpu_bus.nvidia_names([str(tmp_path / "missing.ids"), str(pci_ids)])
    assert names == {"2335": "GH100 [H200]"}
    (tmp_path / "devices").mkdir()
    tree = sysfs_tree(tmp_path / "devices", "0000:00:06.0 0x10de 0x2335 0x030200")
    facts = gpu_bus.classify(gpu_bus.read_sysfs(tree, names=names), "sysfs")
    assert facts["gpus"][0]["name"] == "H200" and facts["gpus"][0]["chip"] == "GH100"


@pytest.mark.parametrize(
    ("line", "kind"),
    [
        # Volta: only the proprietary modules drive it.
        (
            "0000:3b:00.0 3D controller [0302]: NVIDIA Corporation GV100GL [Tesla V100 PCIe 32GB] "
            "[10de:1db6] (rev a1)",
            "gpu",
        ),
        # An nForce chipset's Ethernet shares the NVSwitch class; it is neither.
        (
            "0000:00:14.0 Bridge [0680]: NVIDIA Corporation MCP51 Ethernet Controller [10de:0269] (rev a3)",
            "other",
        ),
    ],
)
def test_old_nvidia_devices(line, kind):
    facts = gpu_bus.classify(gpu_bus.parse_lspci(line), "lspci")
    if kind == "gpu":
        assert facts["pre_turing"] == ["Tesla V100 PCIe 32GB"] and facts["kernel_modules"] == "proprietary"
    else:
        assert facts["gpu_count"] == 0 and facts["nvswitches"] == [] and len(facts["other_functions"]) == 1


def test_unreadable_lspci_line_is_one_line_error():
    with pytest.raises(gpu_bus.BusError, match="not a PCI function: 'garbage'"):
        gpu_bus.parse_lspci("garbage\n")


def fake_lspci(tmp_path, body):
    script = tmp_path / "lspci"
    script.write_text("#!/bin/sh\n" + body)
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    return str(script)


def test_module_runs_lspci_dnn(tmp_path, run_module):
    listing = FIXTURES / "pci-bus/rtx4090-8gpu-pcie/lspci-Dnn.txt"
    script = fake_lspci(tmp_path, f'[ "$*" = "-Dnn" ] || exit 2\ncat {listing}\n')
    result = run_module(gpu_bus, {"lspci": script})
    assert result["changed"] is False
    assert result["ansible_facts"]["gpu_bus"]["source"] == "lspci"
    assert result["ansible_facts"]["gpu_bus"]["gpu_count"] == 8


def test_module_failing_lspci_is_one_line(tmp_path, run_module):
    script = fake_lspci(tmp_path, "echo 'pcilib: Cannot open /proc/bus/pci' >&2\nexit 1\n")
    result = run_module(gpu_bus, {"lspci": script})
    assert result["failed"] is True
    assert result["msg"] == f"gpu_bus: {script} -Dnn failed (rc=1): pcilib: Cannot open /proc/bus/pci"


def test_module_without_lspci_reads_this_machines_sysfs(run_module):
    # This machine has no NVIDIA device and no lspci on PATH under that name: the real sysfs is read.
    result = run_module(gpu_bus, {"lspci": "lspci-not-installed"})
    facts = result["ansible_facts"]["gpu_bus"]
    assert facts["source"] == "sysfs"
    assert facts["gpu_count"] == 0
