"""Unit tests for library/gpu_health.py on real `nvidia-smi -q -x` and kernel log output.

tests/fixtures/nvidia-smi-q/SOURCES.md: a healthy H200 captured by this project. The unhealthy variants
are that same document with counters changed, as nvidia-smi prints them on a GPU with those errors.
"""

import pathlib
import stat

import gpu_health
import pytest

H200 = pathlib.Path(__file__).resolve().parent.parent / "fixtures" / "nvidia-smi-q" / "h200-pcie-vm"
XML = (H200 / "nvidia-smi-q.xml").read_text()
# A desktop's kernel log after the driver reset a GPU, as a user posted it (two real Xid 32 lines).
XID_LOG = """[ 1399.140318] NVRM: GPU at PCI:0000:01:00: GPU-34d7319c-5b19-1e75-186d-c187099e4fe5
[ 1399.140323] NVRM: Xid (PCI:0000:01:00): 32, Channel ID 00000009 intr 00800000
[ 1399.140655] NVRM: Xid (PCI:0000:01:00): 32, Channel ID 00000009 intr 00800000
"""


def test_healthy_h200():
    gpus = gpu_health.parse_query(XML)
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
    assert gpu_health.problems(gpus, gpu_health.parse_xid((H200 / "dmesg-nvrm.txt").read_text()), {}) == []


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
    found = gpu_health.problems(gpu_health.parse_query(XML.replace(old, new)), [], {})
    assert [(p["kind"], p["severity"]) for p in found] == [(kind, "error")]
    assert (
        found[0]["message"].startswith("GPU 00000000:00:06.0 (NVIDIA H200): ")
        and words in found[0]["message"]
    )


def test_xid_since_boot():
    xids = gpu_health.parse_xid(XID_LOG)
    assert [(x["pci"], x["code"]) for x in xids] == [("0000:01:00", 32), ("0000:01:00", 32)]
    found = gpu_health.problems([], xids, {})
    assert found[0]["message"].startswith("Xid 32 on PCI 0000:01:00 since boot: [ 1399.140323] NVRM: Xid")


def test_iommu_translation_is_a_warning_with_the_fix(tmp_path):
    for address, kind in (("0000:01:00.0", "DMA-FQ"), ("0000:21:00.0", "identity")):
        group = tmp_path / "groups" / address
        group.mkdir(parents=True)
        (group / "type").write_text(kind + "\n")
        (tmp_path / address).mkdir()
        (tmp_path / address / "iommu_group").symlink_to(group)
    (tmp_path / "0000:41:00.0").mkdir()  # no group: the IOMMU is off
    types = gpu_health.iommu_types(["0000:01:00.0", "0000:21:00.0", "0000:41:00.0"], devices=str(tmp_path))
    assert types == {"0000:01:00.0": "DMA-FQ", "0000:21:00.0": "identity", "0000:41:00.0": "off"}
    found = gpu_health.problems([], [], types)
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
