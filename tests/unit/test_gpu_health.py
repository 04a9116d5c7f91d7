"""Unit tests for library/gpu_health.py (code: module_utils/gpu_health_facts.py) on real `nvidia-smi -q -x`

tests/fixtures/nvidia-smi-q/SOURCES.md: a healthy H200 captured by this project. The unhealthy variants
are that same document with counters changed, as nvidia-smi prints them on a GPU with those errors.
"""

import pathlib
import stat

import gpu_health
import pytest
from ansible.module_utils import gpu_health_facts as health

H200 = pathlib.Path(__file__).resolve().parent.parent / "fixtures" / "nvidia-smi-q" / "h200-pcie-vm"
XML = (H200 / "nvidia-smi-q.xml").read_text()
# A desktop's kernel log after the driver reset a GPU, as a user posted it (two real Xid 32 lines).
XID_LOG = """[ 1399.140318] NVRM: GPU at PCI:0000:01:00: GPU-34d7319c-5b19-1e75-186d-c187099e4fe5
[ 1399.140323] NVRM: Xid (PCI:0000:01:00): 32, Channel ID 00000009 intr 00800000
[ 1399.140655] NVRM: Xid (PCI:0000:01:00): 32, Channel ID 00000009 intr 00800000
"""


def test_healthy_h200():
    gpus = health.parse_query(XML)
    assert gpus == [
        {
            "bus_id": "00000000:00:06.0",
            "name": "NVIDIA H200",
            "volatile_uncorrectable": 0,
            "aggregate_uncorrectable": 0,
            "remapped_rows_uncorrectable": 0,
            "remap_pending": False,
            "remap_failure": False,
            "retirement_pending": False,
        }
    ]
    assert health.problems(gpus, health.parse_xid((H200 / "dmesg-nvrm.txt").read_text()), {}) == []


@pytest.mark.parametrize(
    ("old", "new", "kind", "words"),
    [
        (
            "<volatile>\n\t\t\t\t<sram_correctable>0</sram_correctable>\n\t\t\t\t<sram_uncorrectable_parity>0",
            "<volatile>\n\t\t\t\t<sram_correctable>0</sram_correctable>\n\t\t\t\t<sram_uncorrectable_parity>2",
            "ecc",
            "2 uncorrectable ECC errors since the driver loaded",
        ),
        (
            "<remapped_row_pending>No<",
            "<remapped_row_pending>Yes<",
            "row_remap",
            "a row remapping waits for a GPU reset",
        ),
        ("<remapped_row_failure>No<", "<remapped_row_failure>Yes<", "row_remap", "row remapping failed"),
    ],
    ids=["uncorrectable-ecc", "remap-pending", "remap-failure"],
)
def test_unfit_gpu(old, new, kind, words):
    assert XML.count(old) == 1
    found = health.problems(health.parse_query(XML.replace(old, new)), [], {})
    assert [(p["kind"], p["severity"]) for p in found] == [(kind, "error")]
    assert (
        found[0]["message"].startswith("GPU 00000000:00:06.0 (NVIDIA H200): ")
        and words in found[0]["message"]
    )


def test_xid_since_boot_where_the_driver_load_left_the_log():
    xids = health.parse_xid(XID_LOG)
    assert [(x["pci"], x["code"], x["kind"]) for x in xids] == [("0000:01:00", 32, "hardware")] * 2
    found = health.problems([], xids, {})
    assert found[0]["message"].startswith(
        "Xid 32 on PCI 0000:01:00 since the driver loaded (not an application"
    )
    assert found[0]["message"].endswith(
        ": [ 1399.140323] NVRM: Xid (PCI:0000:01:00): 32, Channel ID 00000009 intr 00800000"
    )
    assert {p["severity"] for p in found} == {"error"}


KERNEL_LOGS = H200.parent.parent / "kernel-log"


def test_informational_xids_since_the_driver_reloaded_are_warnings():
    """An Xid 79 before the driver reloaded is gone; an application's (13, 45, a contained ECC error 94)
    and the memory events nvidia-smi reports itself (63, 92) are said, and stop nothing."""
    xids = health.parse_xid((KERNEL_LOGS / "xid-informational-after-reload.txt").read_text())
    assert [(x["code"], x["kind"]) for x in xids] == [
        (13, "application"),
        (13, "application"),
        (45, "application"),
        (92, "recorded"),
        (63, "recorded"),
        (94, "application"),
    ]
    found = health.problems([], xids, {})
    assert {p["severity"] for p in found} == {"warning"}
    assert "Xid 94 on PCI 0000:65:00 since the driver loaded (contained ECC error: " in found[-1]["message"]


def test_an_uncontained_ecc_error_stops_the_box():
    xids = health.parse_xid((KERNEL_LOGS / "xid-uncontained-after-reload.txt").read_text())
    errors = [p for p in health.problems([], xids, {}) if p["severity"] == "error"]
    assert [(p["gpu"], p["message"].split(" (")[0]) for p in errors] == [
        ("0000:65:00", "Xid 95 on PCI 0000:65:00 since the driver loaded")
    ]


def test_the_healthy_h200_log_has_its_driver_load_and_no_xid():
    assert health.parse_xid((H200 / "dmesg-nvrm.txt").read_text()) == []


def test_iommu_translation_is_a_warning_with_the_fix(tmp_path):
    for address, kind in (("0000:01:00.0", "DMA-FQ"), ("0000:21:00.0", "identity")):
        group = tmp_path / "groups" / address
        group.mkdir(parents=True)
        (group / "type").write_text(kind + "\n")
        (tmp_path / address).mkdir()
        (tmp_path / address / "iommu_group").symlink_to(group)
    (tmp_path / "0000:41:00.0").mkdir()  # no group: the IOMMU is off
    types = health.iommu_types(["0000:01:00.0", "0000:21:00.0", "0000:41:00.0"], devices=str(tmp_path))
    assert types == {"0000:01:00.0": "DMA-FQ", "0000:21:00.0": "identity", "0000:41:00.0": "off"}
    found = health.problems([], [], types)
    assert [(p["gpu"], p["severity"]) for p in found] == [("0000:01:00.0", "warning")]
    assert "boot with iommu=pt" in found[0]["message"]


def test_module_reads_nvidia_smi_xml(tmp_path, run_module):
    script = tmp_path / "nvidia-smi"
    script.write_text(f'#!/bin/sh\n[ "$*" = "-q -x" ] || exit 2\ncat {H200 / "nvidia-smi-q.xml"}\n')
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    facts = run_module(gpu_health, {"nvidia_smi": str(script)})["ansible_facts"]["gpu_health"]
    assert [gpu["name"] for gpu in facts["gpus"]] == ["NVIDIA H200"]
    assert facts["kernel_log"] == "read" or facts["kernel_log"].startswith("not readable: ")


def test_module_not_xml_is_one_line(tmp_path, run_module):
    script = tmp_path / "nvidia-smi"
    script.write_text(
        "#!/bin/sh\necho 'NVIDIA-SMI has failed because it could not communicate with the NVIDIA driver.'\n"
    )
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    result = run_module(gpu_health, {"nvidia_smi": str(script)})
    assert result["failed"] is True
    assert result["msg"].startswith("gpu_health: nvidia-smi -q -x printed something that is not XML")


BRIDGE = pathlib.Path(__file__).resolve().parent.parent / "fixtures/pci-bus/amd-matisse-downstream-port"


def test_acs_of_a_real_bridge():
    control = health.parse_acs((BRIDGE / "lspci-vvv-bridge.txt").read_text())
    assert control == "SrcValid+ TransBlk- ReqRedir+ CmpltRedir+ UpstreamFwd+ EgressCtrl- DirectTrans-"
    found = health.problems([], [], {}, {"0000:03:02.0": control}, {"0000:06:00.0": ["0000:03:02.0"]})
    assert [(p["gpu"], p["kind"], p["severity"]) for p in found] == [("0000:03:02.0", "acs", "warning")]
    assert found[0]["message"].startswith("bridge 0000:03:02.0 above GPU 0000:06:00.0 redirects peer-to-peer")
    assert found[0]["message"].endswith("setpci -s 0000:03:02.0 ECAP_ACS+0x6.w=0000")
    # ACS off: nothing to say; no ACS capability at all: neither.
    off = control.replace("ReqRedir+", "ReqRedir-").replace("CmpltRedir+", "CmpltRedir-")
    assert health.problems([], [], {}, {"0000:03:02.0": off}, {"0000:06:00.0": ["0000:03:02.0"]}) == []
    assert health.parse_acs("00:00.0 Host bridge: Intel Corporation Device\n\tControl: I/O- Mem+\n") == ""


def sysfs_with_a_gpu_behind_a_switch(tmp_path):
    """The layout of /sys/bus/pci/devices: links into /sys/devices, where a GPU sits behind a switch's
    downstream port, behind a root port."""
    real = tmp_path / "devices/pci0000:00/0000:00:01.2/0000:02:00.0/0000:03:02.0/0000:06:00.0"
    real.mkdir(parents=True)
    bus = tmp_path / "bus"
    bus.mkdir()
    (bus / "0000:06:00.0").symlink_to(real)
    return bus


def test_upstream_bridges_are_the_gpus_parents_in_sysfs(tmp_path):
    bus = sysfs_with_a_gpu_behind_a_switch(tmp_path)
    bridges = health.upstream_bridges("0000:06:00.0", devices=str(bus))
    assert bridges == ["0000:03:02.0", "0000:02:00.0", "0000:00:01.2"]
    assert health.upstream_bridges("0000:07:00.0", devices=str(bus)) == []


def test_module_reads_the_bridges_acs_with_lspci(tmp_path, run_module, monkeypatch):
    smi = tmp_path / "nvidia-smi"
    smi.write_text(f"#!/bin/sh\ncat {H200 / 'nvidia-smi-q.xml'}\n")
    lspci = tmp_path / "lspci"
    # Only the downstream port answers with its real capture; the others have no ACS capability.
    lspci.write_text(
        f'#!/bin/sh\nif [ "$*" = "-vvv -s 0000:03:02.0" ]; then cat {BRIDGE / "lspci-vvv-bridge.txt"}; fi\n'
    )
    for script in (smi, lspci):
        script.chmod(script.stat().st_mode | stat.S_IEXEC)
    # The hardware, at the edge: a sysfs tree in place of the box's.
    monkeypatch.setattr(health, "SYSFS_DEVICES", str(sysfs_with_a_gpu_behind_a_switch(tmp_path)))
    facts = run_module(gpu_health, {"nvidia_smi": str(smi), "lspci": str(lspci), "gpus": ["0000:06:00.0"]})
    facts = facts["ansible_facts"]["gpu_health"]
    assert facts["acs"] == {
        "0000:00:01.2": "none",
        "0000:02:00.0": "none",
        "0000:03:02.0": "SrcValid+ TransBlk- ReqRedir+ CmpltRedir+ UpstreamFwd+ EgressCtrl- DirectTrans-",
    }
    assert facts["iommu"] == {"0000:06:00.0": "off"}
    assert [(p["kind"], p["gpu"]) for p in facts["problems"]] == [("acs", "0000:03:02.0")]
