"""Unit tests for library/gpu_topology.py against real nvidia-smi outputs.

Where each fixture comes from: tests/fixtures/nvidia-smi/SOURCES.md.
"""

import pathlib
import re
import shutil
import stat

import gpu_health
import gpu_topology as gt
import pytest

FIXTURES = pathlib.Path(__file__).resolve().parent.parent / "fixtures" / "nvidia-smi"

PCIE_SET = {
    "NCCL_PROTO": "LL",
    "NCCL_ALGO": "Ring",
    "NCCL_MAX_NCHANNELS": "16",
    "NCCL_BUFFSIZE": "16777216",
    "NCCL_NTHREADS": "512",
    "CUDA_DEVICE_MAX_CONNECTIONS": "1",
}


def topo_text(box):
    return (FIXTURES / box / "topo-m.txt").read_text()


def query_text(box):
    return (FIXTURES / box / "query-noheader.csv").read_text()


def facts_for(box):
    return gt.build_topology(gt.parse_topo_matrix(topo_text(box)), gt.parse_gpu_query(query_text(box)))


# Expected values read off each fixture by hand.
EXPECTED = {
    "rtx4090-8gpu-pcie": dict(
        gpu_count=8,
        interconnect="pcie",
        worst_hop="SYS",
        nvlink_min=None,
        nvlink_all_pairs=False,
        nics=[],
        affinity0=("0-15,32-47", "0", None),
        affinity7=("16-31,48-63", "1", None),
        link_0_1="NODE",
        link_1_2="PHB",
        rule="pcie",
    ),
    "h100-8gpu-nvlink-nics": dict(
        gpu_count=8,
        interconnect="nvlink",
        worst_hop=None,
        nvlink_min=18,
        nvlink_all_pairs=True,
        nics=[f"mlx5_{i}" for i in range(8)],
        affinity0=("0-47,96-143", "0", None),
        affinity7=("48-95,144-191", "1", None),
        link_0_1="NV18",
        link_1_2="NV18",
        rule="nvlink",
    ),
    "a100-8gpu-nvlink-nics": dict(
        gpu_count=8,
        interconnect="nvlink",
        worst_hop=None,
        nvlink_min=12,
        nvlink_all_pairs=True,
        nics=[f"mlx5_{i}" for i in range(10)],
        affinity0=("48-63,176-191", "3", None),
        affinity7=("80-95,208-223", "5", None),
        link_0_1="NV12",
        link_1_2="NV12",
        rule="nvlink",
    ),
    "rtx6000ada-4gpu-pcie-nics": dict(
        gpu_count=4,
        interconnect="pcie",
        worst_hop="SYS",
        nvlink_min=None,
        nvlink_all_pairs=False,
        nics=["mlx5_0", "mlx5_1", "mlx5_2", "mlx5_3"],
        affinity0=("0-31", "0", None),
        affinity7=None,
        link_0_1="NODE",
        link_1_2="SYS",
        rule="pcie",
    ),
    "v100-4gpu-nvlink-pairs": dict(
        gpu_count=4,
        interconnect="nvlink",
        worst_hop="SYS",
        nvlink_min=3,
        nvlink_all_pairs=False,
        nics=["mlx5_0", "mlx5_1", "mlx5_2", "mlx5_3"],
        affinity0=("0-63", "0", None),
        affinity7=None,
        link_0_1="NV3",
        link_1_2="SYS",
        rule="nvlink",
    ),
    "h200-2gpu-nvlink": dict(
        gpu_count=2,
        interconnect="nvlink",
        worst_hop=None,
        nvlink_min=18,
        nvlink_all_pairs=True,
        nics=[],
        affinity0=("0-31", "0", None),
        affinity7=None,
        link_0_1="NV18",
        link_1_2=None,
        rule="nvlink",
    ),
    "h200-1gpu": dict(
        gpu_count=1,
        interconnect="pcie",
        worst_hop=None,
        nvlink_min=None,
        nvlink_all_pairs=False,
        nics=[],
        affinity0=("0-15", "0", None),
        affinity7=None,
        link_0_1=None,
        link_1_2=None,
        rule="single-gpu",
    ),
}


def test_every_fixture_directory_is_covered():
    boxes = sorted(path.name for path in FIXTURES.iterdir() if path.is_dir())
    assert boxes == sorted(EXPECTED)
    for box in boxes:
        assert (FIXTURES / box / "topo-m.txt").is_file()
        assert (FIXTURES / box / "query-noheader.csv").is_file()


@pytest.mark.parametrize("box", sorted(EXPECTED))
def test_parse_fixture(box):
    want = EXPECTED[box]
    topo = gt.parse_topo_matrix(topo_text(box))
    assert topo["gpu_count"] == want["gpu_count"]
    assert topo["interconnect"] == want["interconnect"]
    assert topo["worst_hop"] == want["worst_hop"]
    assert topo["nvlink_min"] == want["nvlink_min"]
    assert topo["nvlink_all_pairs"] is want["nvlink_all_pairs"]
    assert topo["nics"] == want["nics"]
    assert len(topo["links"]) == want["gpu_count"]
    assert all(len(row) == want["gpu_count"] for row in topo["links"])
    assert all(topo["links"][i][i] == "X" for i in range(want["gpu_count"]))
    first = topo["affinity"][0]
    assert (first["cpu_affinity"], first["numa_affinity"], first["gpu_numa_id"]) == want["affinity0"]
    if want["affinity7"]:
        last = topo["affinity"][7]
        assert (last["cpu_affinity"], last["numa_affinity"], last["gpu_numa_id"]) == want["affinity7"]
    if want["link_0_1"]:
        assert topo["links"][0][1] == want["link_0_1"]
    if want["link_1_2"]:
        assert topo["links"][1][2] == want["link_1_2"]


@pytest.mark.parametrize("box", sorted(EXPECTED))
def test_query_and_facts_agree(box):
    facts = facts_for(box)
    want = EXPECTED[box]
    assert facts["gpu_count"] == want["gpu_count"] == len(facts["gpus"])
    assert [gpu["index"] for gpu in facts["gpus"]] == list(range(want["gpu_count"]))
    assert facts["nccl_env_rule"] == want["rule"]
    assert facts["gpus"][0]["cpu_affinity"] == want["affinity0"][0]


def test_rtx4090_matrix_details():
    links = gt.parse_topo_matrix(topo_text("rtx4090-8gpu-pcie"))["links"]
    # GPU6/GPU7 sit on the second NUMA node: SYS to everyone else, PHB to each other.
    assert links[6] == ["SYS"] * 6 + ["X", "PHB"]
    assert links[3][4] == links[4][3] == "PHB"
    assert links[0][5] == "NODE"


def test_query_rtx4090_values():
    gpus = gt.parse_gpu_query(query_text("rtx4090-8gpu-pcie"))
    assert gpus[0] == {
        "index": 0,
        "name": "NVIDIA GeForce RTX 4090",
        "memory_mib": 24564,
        "pci_bus_id": "00000000:01:00.0",
    }
    assert gpus[7]["pci_bus_id"] == "00000000:A2:00.0"


def test_query_h200_real_capture():
    assert gt.parse_gpu_query(query_text("h200-1gpu")) == [
        {"index": 0, "name": "NVIDIA H200", "memory_mib": 143771, "pci_bus_id": "00000000:00:06.0"}
    ]


def test_query_accepts_memory_before_bus_id():
    # Real output of --query-gpu=index,name,memory.total,pci.bus_id on the 2x H200 box (h200-2gpu-nvlink).
    text = "0, NVIDIA H200, 143771, 00000000:00:06.0\n1, NVIDIA H200, 143771, 00000000:00:07.0\n"
    assert gt.parse_gpu_query(text) == gt.parse_gpu_query(query_text("h200-2gpu-nvlink"))
    assert gt.parse_gpu_query(text)[1]["pci_bus_id"] == "00000000:00:07.0"


def test_query_power9_domain_bus_ids():
    gpus = gt.parse_gpu_query(query_text("v100-4gpu-nvlink-pairs"))
    assert [gpu["pci_bus_id"] for gpu in gpus][2] == "00000035:03:00.0"
    assert gpus[0]["name"] == "Tesla V100-SXM2-32GB"


# --- NCCL environment -------------------------------------------------------------------------------------


def test_nccl_env_pcie_without_nics_disables_ib():
    env = facts_for("rtx4090-8gpu-pcie")["nccl_env"]
    assert env == dict(PCIE_SET, NCCL_P2P_LEVEL="SYS", NCCL_IB_DISABLE="1")
    assert all(isinstance(key, str) and isinstance(value, str) for key, value in env.items())


def test_nccl_env_pcie_with_nics_keeps_ib():
    env = facts_for("rtx6000ada-4gpu-pcie-nics")["nccl_env"]
    assert env == dict(PCIE_SET, NCCL_P2P_LEVEL="SYS")
    assert "NCCL_IB_DISABLE" not in env


@pytest.mark.parametrize("box", ["h100-8gpu-nvlink-nics", "a100-8gpu-nvlink-nics", "v100-4gpu-nvlink-pairs"])
def test_nccl_env_nvlink_is_empty(box):
    facts = facts_for(box)
    assert facts["interconnect"] == "nvlink"
    assert facts["nccl_env"] == {}


def test_nccl_env_single_gpu_is_empty():
    facts = facts_for("h200-1gpu")
    assert facts["nccl_env"] == {}
    assert facts["nccl_env_rule"] == "single-gpu"


@pytest.mark.parametrize("hop", ["PIX", "PXB", "PHB", "NODE", "SYS"])
def test_nccl_p2p_level_follows_worst_hop(hop):
    topology = {"gpu_count": 2, "interconnect": "pcie", "worst_hop": hop, "nics": ["mlx5_0"]}
    assert gt.recommend_nccl_env(topology) == dict(PCIE_SET, NCCL_P2P_LEVEL=hop)


def test_worst_hop_order():
    links = [["X", "PIX", "PHB"], ["PIX", "X", "PXB"], ["PHB", "PXB", "X"]]
    assert gt.summarize_links(links)["worst_hop"] == "PHB"
    links = [["X", "NODE", "PHB"], ["NODE", "X", "PXB"], ["PHB", "PXB", "X"]]
    assert gt.summarize_links(links)["worst_hop"] == "NODE"


def test_every_pcie_rule_has_a_reason():
    for name, value, why in gt.PCIE_TUNED_NCCL_ENV:
        assert name and isinstance(value, str) and len(why) > 20


# --- layout variants ----------------------------------------------------------------------------------------


def _tabs_to_spaces(text):
    """Re-print a tab-separated matrix the way space-padding tools do (columns 8 wide)."""
    return "\n".join(line.expandtabs(8) for line in text.split("\n"))


def _spaces_to_tabs(text):
    out = []
    for line in text.split("\n"):
        if re.match(r"^\s*GPU0\b|^(GPU|NIC|mlx)", line):
            line = re.sub(r" {2,}", "\t", line)
        out.append(line)
    return "\n".join(out)


def _comparable(topo):
    return {key: topo[key] for key in ("gpu_count", "links", "nics", "affinity", "interconnect", "worst_hop")}


@pytest.mark.parametrize("box", ["rtx4090-8gpu-pcie", "a100-8gpu-nvlink-nics", "v100-4gpu-nvlink-pairs"])
def test_tab_fixture_reprinted_with_spaces(box):
    text = topo_text(box)
    assert "\t" in text
    spaced = _tabs_to_spaces(text)
    assert "\t" not in spaced
    assert _comparable(gt.parse_topo_matrix(spaced)) == _comparable(gt.parse_topo_matrix(text))


@pytest.mark.parametrize("box", ["h100-8gpu-nvlink-nics", "rtx6000ada-4gpu-pcie-nics"])
def test_space_fixture_reprinted_with_tabs(box):
    text = topo_text(box)
    assert "\t" not in text
    tabbed = _spaces_to_tabs(text)
    assert "\t" in tabbed
    assert _comparable(gt.parse_topo_matrix(tabbed)) == _comparable(gt.parse_topo_matrix(text))


def test_single_space_columns():
    # Some re-printed outputs separate columns with one space ("GPU0 GPU1    CPU Affinity").
    text = topo_text("rtx4090-8gpu-pcie")
    squeezed = "\n".join(re.sub(r"[ \t]+", " ", line) for line in text.split("\n"))
    assert _comparable(gt.parse_topo_matrix(squeezed)) == _comparable(gt.parse_topo_matrix(text))


def test_ansi_header_real_h200():
    text = topo_text("h200-1gpu")
    assert "\x1b[4m" in text and "\x1b[0m" in text
    topo = gt.parse_topo_matrix(text)
    assert topo["gpu_count"] == 1
    assert topo["links"] == [["X"]]
    assert topo["affinity"] == [{"cpu_affinity": "0-15", "numa_affinity": "0", "gpu_numa_id": None}]


def test_ansi_header_real_two_h200():
    text = topo_text("h200-2gpu-nvlink")
    assert text.startswith("\t\x1b[4mGPU0\tGPU1\t")
    topo = gt.parse_topo_matrix(text)
    assert topo["links"] == [["X", "NV18"], ["NV18", "X"]]
    assert topo["affinity"][1] == {"cpu_affinity": "0-31", "numa_affinity": "0", "gpu_numa_id": None}


def test_ansi_header_on_eight_gpus():
    text = topo_text("rtx4090-8gpu-pcie")
    header, rest = text.split("\n", 1)
    underlined = "\t\x1b[4m" + header.lstrip("\t") + "\x1b[0m\n" + rest
    assert _comparable(gt.parse_topo_matrix(underlined)) == _comparable(gt.parse_topo_matrix(text))


def test_old_soc_label_counts_as_sys():
    text = "\tGPU0\tGPU1\tCPU Affinity\nGPU0\t X \tSOC\t0-11\nGPU1\tSOC\t X \t12-23\n"
    topo = gt.parse_topo_matrix(text)
    assert topo["worst_hop"] == "SYS"
    assert topo["affinity"][1]["cpu_affinity"] == "12-23"
    assert topo["affinity"][1]["numa_affinity"] is None


def test_nic_columns_without_legend_keep_their_label():
    text = "\tGPU0\tGPU1\tNIC0\nGPU0\t X \tPIX\tPIX\nGPU1\tPIX\t X \tPIX\nNIC0\tPIX\tPIX\t X \n"
    assert gt.parse_topo_matrix(text)["nics"] == ["NIC0"]


# --- failures ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text, reason",
    [
        ("", "no header row"),
        ("NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.\n", "no header row"),
        ("\tGPU0\tGPU1\nGPU0\t X \tNV4\n", "no row for GPU1"),
        ("\tGPU0\tGPU1\nGPU0\t X \nGPU1\tNV4\t X \n", "link cells"),
        ("\tGPU0\tGPU1\nGPU0\tNV4\t X \nGPU1\tNV4\t X \n", "misaligned"),
        ("\tGPU0\tGPU1\nGPU0\t X \tWAT\nGPU1\tWAT\t X \n", "unknown link"),
        ("\tGPU0\tGPU1\nGPU0\t X \tPIX\nGPU9\tPIX\t X \n", "not one of the header"),
        ("\tGPU1\tGPU0\nGPU0\t X \tPIX\n", "no header row"),
        (
            "\tGPU0\tNIC0\nGPU0\t X \tPIX\nNIC0\tPIX\t X \n\nNIC Legend:\n\n  NIC1: mlx5_1\n",
            "does not name NIC0",
        ),
    ],
)
def test_parse_topo_rejects_garbage(text, reason):
    with pytest.raises(gt.TopologyParseError, match=reason):
        gt.parse_topo_matrix(text)


@pytest.mark.parametrize(
    "text, reason",
    [
        ("", "no GPUs listed"),
        ("No devices were found\n", "expected 4"),
        ("0, NVIDIA H200, 00000000:00:06.0\n", "expected 4"),
        ("0, NVIDIA H200, 00000000:00:06.0, [N/A]\n", "no PCI bus id and memory"),
        ("x, NVIDIA H200, 00000000:00:06.0, 143771\n", "not a number"),
        ("0, NVIDIA H200, 00000000:00:06.0, 1\n0, NVIDIA H200, 00000000:00:07.0, 1\n", "not 0..1"),
    ],
)
def test_parse_query_rejects_garbage(text, reason):
    with pytest.raises(gt.TopologyParseError, match=reason):
        gt.parse_gpu_query(text)


def test_build_topology_rejects_count_mismatch():
    topo = gt.parse_topo_matrix(topo_text("rtx4090-8gpu-pcie"))
    gpus = gt.parse_gpu_query(query_text("rtx4090-8gpu-pcie"))[:7]
    with pytest.raises(gt.TopologyParseError, match=r"shows 8 GPU\(s\) but .* lists 7"):
        gt.build_topology(topo, gpus)


# --- the module entry point, end to end with a fake nvidia-smi ------------------------------------------


def fake_nvidia_smi(tmp_path, topo_file, query_file, topo_rc=0, stderr=""):
    """A shell script that answers `topo -m` and `--query-gpu=...` from files and logs every call."""
    log = tmp_path / "calls.log"
    script = tmp_path / "nvidia-smi"
    script.write_text(
        "#!/bin/sh\n"
        f'echo "$*" >> "{log}"\n'
        'case "$1" in\n'
        f'  topo) [ -n "{stderr}" ] && echo "{stderr}" >&2; cat "{topo_file}"; exit {topo_rc} ;;\n'
        f'  --query-gpu=*) cat "{query_file}"; exit 0 ;;\n'
        "esac\n"
        'echo "unexpected arguments: $*" >&2\n'
        "exit 2\n"
    )
    script.chmod(script.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return script, log


def test_main_rtx4090_end_to_end(tmp_path, run_module):
    box = FIXTURES / "rtx4090-8gpu-pcie"
    script, log = fake_nvidia_smi(tmp_path, box / "topo-m.txt", box / "query-noheader.csv")
    result = run_module(gt, {"nvidia_smi": str(script), "_ansible_check_mode": True})
    assert result.get("failed") is not True, result
    assert result["changed"] is False
    facts = result["ansible_facts"]["gpu_topology"]
    assert facts["gpu_count"] == 8
    assert facts["interconnect"] == "pcie"
    assert facts["worst_hop"] == "SYS"
    assert facts["nics"] == []
    assert facts["nccl_env"] == dict(PCIE_SET, NCCL_P2P_LEVEL="SYS", NCCL_IB_DISABLE="1")
    assert facts["gpus"][7] == {
        "index": 7,
        "name": "NVIDIA GeForce RTX 4090",
        "memory_mib": 24564,
        "pci_bus_id": "00000000:A2:00.0",
        "cpu_affinity": "16-31,48-63",
        "numa_affinity": "1",
        "gpu_numa_id": None,
    }
    assert facts["nvidia_smi"] == str(script)
    # Exactly the two documented commands, in order.
    assert log.read_text().splitlines() == [
        "topo -m",
        "--query-gpu=index,name,pci.bus_id,memory.total --format=csv,noheader,nounits",
    ]


def test_main_nvlink_bare_name_on_path(tmp_path, run_module, monkeypatch):
    box = FIXTURES / "h100-8gpu-nvlink-nics"
    fake_nvidia_smi(tmp_path, box / "topo-m.txt", box / "query-noheader.csv")
    monkeypatch.setenv("PATH", f"{tmp_path}:/usr/bin:/bin")
    result = run_module(gt, {})
    assert result.get("failed") is not True, result
    assert result["changed"] is False
    facts = result["ansible_facts"]["gpu_topology"]
    assert facts["nvidia_smi"] == str(tmp_path / "nvidia-smi")
    assert facts["interconnect"] == "nvlink"
    assert facts["nccl_env"] == {}
    assert facts["nccl_env_rule"] == "nvlink"
    assert facts["nics"][-1] == "mlx5_7"


def test_main_single_h200(tmp_path, run_module):
    box = FIXTURES / "h200-1gpu"
    script, _log = fake_nvidia_smi(tmp_path, box / "topo-m.txt", box / "query-noheader.csv")
    facts = run_module(gt, {"nvidia_smi": str(script)})["ansible_facts"]["gpu_topology"]
    assert facts["gpu_count"] == 1
    assert facts["gpus"][0]["memory_mib"] == 143771
    assert facts["worst_hop"] is None
    assert facts["nccl_env"] == {}


def test_main_fails_on_count_mismatch(tmp_path, run_module):
    script, _log = fake_nvidia_smi(
        tmp_path, FIXTURES / "rtx4090-8gpu-pcie" / "topo-m.txt", FIXTURES / "h200-1gpu" / "query-noheader.csv"
    )
    result = run_module(gt, {"nvidia_smi": str(script)})
    assert result["failed"] is True
    assert "shows 8 GPU(s)" in result["msg"] and "lists 1" in result["msg"]
    assert "\n" not in result["msg"]


def test_main_fails_on_garbage_topology(tmp_path, run_module):
    garbage = tmp_path / "garbage.txt"
    garbage.write_text("hello\nthis is not a topology\n")
    script, _log = fake_nvidia_smi(tmp_path, garbage, FIXTURES / "h200-1gpu" / "query-noheader.csv")
    result = run_module(gt, {"nvidia_smi": str(script)})
    assert result["failed"] is True
    assert result["msg"].startswith("cannot parse `nvidia-smi topo -m`: no header row")
    assert "this is not a topology" in result["msg"]


def test_main_fails_on_garbage_query(tmp_path, run_module):
    garbage = tmp_path / "garbage.csv"
    garbage.write_text("0, NVIDIA H200\n")
    script, _log = fake_nvidia_smi(tmp_path, FIXTURES / "h200-1gpu" / "topo-m.txt", garbage)
    result = run_module(gt, {"nvidia_smi": str(script)})
    assert result["failed"] is True
    assert result["msg"].startswith("cannot parse `nvidia-smi --query-gpu=index,name,pci.bus_id,memory.total")


def test_main_fails_on_nonzero_rc(tmp_path, run_module):
    message = "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver."
    empty = tmp_path / "empty"
    empty.write_text("")
    script, _log = fake_nvidia_smi(tmp_path, empty, empty, topo_rc=9, stderr=message)
    result = run_module(gt, {"nvidia_smi": str(script)})
    assert result["failed"] is True
    assert result["msg"] == "`nvidia-smi topo -m` failed with rc=9: " + message
    assert result["rc"] == 9


def test_main_fails_when_binary_missing(tmp_path, run_module, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))
    result = run_module(gt, {"nvidia_smi": "nvidia-smi-not-installed"})
    assert result["failed"] is True
    assert (
        result["msg"] == f"nvidia-smi-not-installed not found on {tmp_path}: is the NVIDIA driver installed?"
    )


def test_main_fails_when_path_missing(tmp_path, run_module):
    missing = tmp_path / "no" / "nvidia-smi"
    result = run_module(gt, {"nvidia_smi": str(missing)})
    assert result["failed"] is True
    assert result["msg"] == f"{missing} not found or not executable: is the NVIDIA driver installed?"


def test_main_rejects_unknown_option(run_module):
    result = run_module(gt, {"nvidia_smi": "nvidia-smi", "bogus": 1})
    assert result["failed"] is True
    assert "bogus" in result["msg"]


def test_health_comes_in_the_same_call_as_gpu_health_reads_it(sim_nvidia_smi, run_module):
    data, binary = sim_nvidia_smi("rtx4090-8gpu-pcie", "550.54.15")
    shutil.copy(FIXTURES.parent / "nvidia-smi-q" / "h200-pcie-vm" / "nvidia-smi-q.xml", data)
    facts = run_module(gt, {"nvidia_smi": str(binary), "health": {}})["ansible_facts"]
    assert facts["gpu_topology"]["gpu_count"] == 8
    alone = run_module(gpu_health, {"nvidia_smi": str(binary)})["ansible_facts"]["gpu_health"]
    assert facts["gpu_health"] == alone
    topology_ids = [gpu["pci_bus_id"] for gpu in facts["gpu_topology"]["gpus"]]
    assert [gpu["bus_id"] for gpu in alone["gpus"]] == topology_ids
    assert "gpu_health" not in run_module(gt, {"nvidia_smi": str(binary)})["ansible_facts"]
