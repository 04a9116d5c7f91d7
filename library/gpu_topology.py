#!/usr/bin/python
"""Ansible facts module: GPU interconnect topology from nvidia-smi, plus the NCCL environment it calls for."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: gpu_topology
short_description: Read the GPU interconnect topology with nvidia-smi and recommend an NCCL environment
description:
  - Runs exactly two read-only commands on the managed host,
    C(nvidia-smi topo -m) and
    C(nvidia-smi --query-gpu=index,name,pci.bus_id,memory.total --format=csv,noheader,nounits),
    and returns what they say as the C(gpu_topology) fact.
  - The fact holds the GPUs (name, memory, PCI bus id, CPU and NUMA affinity), the GPU-by-GPU link matrix,
    whether any GPU pair is joined by NVLink, the worst PCIe hop between two GPUs, the RDMA NICs that
    C(nvidia-smi) lists, and C(nccl_env), the NCCL environment recommended for that topology.
  - C(nccl_env) is empty on NVLink boxes and on single-GPU boxes (NCCL's own defaults are left alone), and
    is a hand-tuned PCIe set on PCIe-only boxes with two GPUs or more. It is a default derived from the
    topology, never the last word; combine it with per-host or per-group overrides.
  - "With I(health), the same call also returns the C(gpu_health) fact, as M(gpu_health) reads it (its
    C(nvidia-smi -q -x), the kernel log, the IOMMU groups and the bridges' ACS): a deploy reads both before
    serving, and one call to the box costs less than two."
  - Changes nothing on the host; C(changed) is always C(false).
options:
  health:
    description:
      - Read the GPUs' health too (the C(gpu_health) fact; M(gpu_health) documents it), with the same
        I(nvidia_smi).
      - Omitted, only the topology is read.
    type: dict
    suboptions:
      gpus:
        description: The GPUs' PCI addresses (C(gpu_bus.gpus[].address)), whose IOMMU groups are read.
        type: list
        elements: str
        default: []
      lspci:
        description: The C(lspci) to read the bridges' ACS state with; a bare name is looked up on E(PATH).
        type: str
        default: lspci
  nvidia_smi:
    description:
      - The C(nvidia-smi) binary to run.
      - A bare name is looked up on the host's E(PATH) (and the usual C(sbin) directories).
      - A path (anything containing C(/)) is used as given.
    type: str
    default: nvidia-smi
extends_documentation_fragment:
  - action_common_attributes
  - action_common_attributes.facts
attributes:
  check_mode:
    support: full
  diff_mode:
    support: none
  facts:
    support: full
  platform:
    platforms: posix
notes:
  - Fails with one line naming the command and the reason when C(nvidia-smi) is missing, exits non-zero,
    prints something that cannot be parsed, or when C(topo -m) and C(--query-gpu) disagree on the number of
    GPUs. It never guesses a topology.
  - Both column layouts of C(topo -m) are understood (tab-separated, as C(nvidia-smi) prints it, and
    space-separated, as some tools re-print it), with or without the ANSI underline on the header row, with
    NIC rows (C(mlx5_0) style or C(NIC0) style with a C(NIC Legend)), and with or without the
    C(CPU Affinity), C(NUMA Affinity) and C(GPU NUMA ID) columns.
  - The rules behind C(nccl_env) live in one table in the module source, next to C(recommend_nccl_env), with
    the reason for every value.
author:
  - specfleet maintainers
"""

EXAMPLES = r"""
- name: Read the GPU topology
  gpu_topology:

- name: Read the GPU topology and, in the same call, the GPUs' health
  gpu_topology:
    health:
      gpus: "{{ gpu_bus.gpus | map(attribute='address') }}"

- name: Use an nvidia-smi that is not on PATH
  gpu_topology:
    nvidia_smi: /opt/nvidia/bin/nvidia-smi

- name: Refuse a tensor-parallel size larger than the box
  ansible.builtin.assert:
    that: vllm_tensor_parallel_size | int <= ansible_facts.gpu_topology.gpu_count
    fail_msg: >-
      vllm_tensor_parallel_size={{ vllm_tensor_parallel_size }} but this box has
      {{ ansible_facts.gpu_topology.gpu_count }} GPU(s)

- name: Topology-derived NCCL environment, host and group overrides win
  ansible.builtin.set_fact:
    vllm_service_nccl_env: >-
      {{ ansible_facts.gpu_topology.nccl_env | combine(vllm_service_nccl_env_overrides | default({})) }}
"""

RETURN = r"""
ansible_facts:
  description: Facts added to C(ansible_facts).
  returned: always
  type: complex
  contains:
    gpu_topology:
      description: The GPU topology of the host and the NCCL environment recommended for it.
      returned: always
      type: complex
      contains:
        gpu_count:
          description: Number of GPUs; C(topo -m) and C(--query-gpu) agree on it or the module fails.
          returned: always
          type: int
          sample: 8
        gpus:
          description: One entry per GPU, ordered by index.
          returned: always
          type: list
          elements: dict
          contains:
            index:
              description: The nvidia-smi index of the GPU (C(GPU<index>) in C(topo -m)).
              type: int
              sample: 0
            name:
              description: Product name.
              type: str
              sample: NVIDIA GeForce RTX 4090
            memory_mib:
              description: Total memory in MiB.
              type: int
              sample: 24564
            pci_bus_id:
              description: PCI bus id as nvidia-smi prints it.
              type: str
              sample: "00000000:01:00.0"
            cpu_affinity:
              description: CPUs local to the GPU (C(CPU Affinity) column); null when absent or C(N/A).
              type: str
              sample: 0-15,32-47
            numa_affinity:
              description: NUMA node(s) local to the GPU (C(NUMA Affinity) column); null if absent or C(N/A).
              type: str
              sample: "0"
            gpu_numa_id:
              description: The GPU's own NUMA node id (C(GPU NUMA ID) column); null when absent or C(N/A).
              type: str
              sample: null
        interconnect:
          description: C(nvlink) when any two GPUs are joined by NVLink (C(NV#)), else C(pcie).
          returned: always
          type: str
          sample: pcie
        links:
          description:
            - The GPU-by-GPU link matrix; C(links[i][j]) is the link between GPU C(i) and GPU C(j) as
              C(topo -m) prints it (C(X) on the diagonal, C(NV#), C(PIX), C(PXB), C(PHB), C(NODE), C(SYS)).
          returned: always
          type: list
          elements: list
          sample: [["X", "NODE"], ["NODE", "X"]]
        worst_hop:
          description:
            - The worst PCIe hop between two GPUs, in the order PIX < PXB < PHB < NODE < SYS.
            - Null on a single-GPU box and when every GPU pair is joined by NVLink.
          returned: always
          type: str
          sample: SYS
        nvlink_min:
          description:
            - The fewest bonded NVLinks between any two NVLink-joined GPUs (18 for C(NV18)).
            - Null without NVLink.
          returned: always
          type: int
          sample: 18
        nvlink_all_pairs:
          description: True when every pair of GPUs is joined by NVLink (false on a single-GPU box).
          returned: always
          type: bool
          sample: false
        nics:
          description: RDMA NICs listed by C(topo -m), named through the C(NIC Legend) when there is one.
          returned: always
          type: list
          elements: str
          sample: [mlx5_0, mlx5_1]
        nccl_env:
          description:
            - Recommended NCCL environment (names and values are strings). Empty means leave NCCL's defaults.
          returned: always
          type: dict
          sample: {"NCCL_PROTO": "LL", "NCCL_ALGO": "Ring", "NCCL_P2P_LEVEL": "SYS"}
        nccl_env_rule:
          description: Which rule produced C(nccl_env).
          returned: always
          type: str
          choices: [single-gpu, nvlink, pcie]
          sample: pcie
        nvidia_smi:
          description: The nvidia-smi binary that was run.
          returned: always
          type: str
          sample: /usr/bin/nvidia-smi
    gpu_health:
      description: The GPUs' health, as M(gpu_health) returns it (C(gpus), C(xid), C(kernel_log), C(iommu),
        C(acs), C(problems)).
      returned: with I(health)
      type: dict
"""

import csv
import os
import re

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.gpu_health_facts import HEALTH_OPTIONS, HealthError, read_gpu_health
from ansible.module_utils.text_excerpt import excerpt as one_line

TOPO_ARGS = ["topo", "-m"]
# Same field order as the real capture in tests/fixtures/nvidia-smi/h200-1gpu/query-noheader.csv.
# parse_gpu_query() tells the bus id from the memory by their shape, so either order parses.
QUERY_FIELDS = "index,name,pci.bus_id,memory.total"
QUERY_ARGS = ["--query-gpu=" + QUERY_FIELDS, "--format=csv,noheader,nounits"]

# Best to worst; the legend of `nvidia-smi topo -m` defines them.
PCIE_HOPS = ("PIX", "PXB", "PHB", "NODE", "SYS")
# Drivers older than the NODE/SYS split printed SOC for a socket-crossing hop.
LINK_ALIASES = {"SOC": "SYS"}
AFFINITY_COLUMNS = ("CPU Affinity", "NUMA Affinity", "GPU NUMA ID")
AFFINITY_KEYS = {
    "CPU Affinity": "cpu_affinity",
    "NUMA Affinity": "numa_affinity",
    "GPU NUMA ID": "gpu_numa_id",
}

ANSI_RE = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]")
# Multi-word column titles hold single spaces, and some re-printed outputs separate columns with one space,
# so the titles are matched whole before anything else is split on whitespace.
HEADER_TOKEN_RE = re.compile("|".join(re.escape(title) for title in AFFINITY_COLUMNS) + r"|\S+")
GPU_LABEL_RE = re.compile(r"^GPU(\d+)$")
NIC_LABEL_RE = re.compile(r"^NIC\d+$")
NIC_LEGEND_RE = re.compile(r"^\s*(NIC\d+)\s*:\s*(\S+)\s*$")
NVLINK_RE = re.compile(r"^NV(\d+)$")
BUS_ID_RE = re.compile(r"^[0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-7]$")


class TopologyParseError(ValueError):
    """nvidia-smi printed something this module will not guess about."""


def strip_ansi(text):
    return ANSI_RE.sub("", text)


def excerpt(text, limit=200):
    """One line, at most `limit` characters, of command output for an error message (ANSI colours removed)."""
    return one_line(strip_ansi(text or ""), limit)


def _normalise_link(cell):
    return LINK_ALIASES.get(cell, cell)


def _is_known_gpu_link(cell):
    return cell == "X" or cell in PCIE_HOPS or NVLINK_RE.match(cell) is not None


def summarize_links(links):
    """interconnect, worst_hop, nvlink_min, nvlink_all_pairs of a GPU-by-GPU link matrix."""
    nvlinks, hops, pairs = [], [], 0
    for i, row in enumerate(links):
        for j in range(i + 1, len(row)):
            pairs += 1
            match = NVLINK_RE.match(row[j])
            if match:
                nvlinks.append(int(match.group(1)))
            else:
                hops.append(row[j])
    return {
        "interconnect": "nvlink" if nvlinks else "pcie",
        "worst_hop": max(hops, key=PCIE_HOPS.index) if hops else None,
        "nvlink_min": min(nvlinks) if nvlinks else None,
        "nvlink_all_pairs": pairs > 0 and len(nvlinks) == pairs,
    }


def parse_topo_matrix(text):
    """Parse `nvidia-smi topo -m`.

    Returns a dict with gpu_count, links (GPU-by-GPU, list of lists), nics, affinity (one dict per GPU with
    cpu_affinity / numa_affinity / gpu_numa_id, None when absent or N/A) and the summary of summarize_links().
    Raises TopologyParseError on anything it does not understand.
    """
    lines = strip_ansi(text or "").splitlines()

    header_at, columns = None, []
    for number, line in enumerate(lines):
        tokens = HEADER_TOKEN_RE.findall(line)
        if tokens and tokens[0] == "GPU0" and "X" not in tokens:
            header_at, columns = number, tokens
            break
    if header_at is None:
        raise TopologyParseError("no header row starting with GPU0")

    devices = []
    for token in columns:
        if token in AFFINITY_COLUMNS:
            break
        devices.append(token)
    trailing = columns[len(devices) :]

    gpu_labels = [label for label in devices if GPU_LABEL_RE.match(label)]
    expected = [f"GPU{index}" for index in range(len(gpu_labels))]
    if devices[: len(gpu_labels)] != expected:
        raise TopologyParseError(f"header columns are not GPU0..GPU{len(gpu_labels) - 1} first: {devices}")

    rows = {}
    for line in lines[header_at + 1 :]:
        if not line.strip():
            if rows:
                break
            continue
        if line.strip().startswith("Legend"):
            break
        cells = line.split()
        label = cells[0]
        if label not in devices:
            raise TopologyParseError(f"row {label!r} is not one of the header's columns")
        if label in rows:
            raise TopologyParseError(f"row {label!r} appears twice")
        if len(cells) - 1 < len(devices):
            raise TopologyParseError(
                f"row {label} has {len(cells) - 1} link cells, the header has {len(devices)} columns"
            )
        rows[label] = cells[1:]

    links = []
    affinity = []
    for i, label in enumerate(gpu_labels):
        if label not in rows:
            raise TopologyParseError(f"no row for {label}")
        row = [_normalise_link(cell) for cell in rows[label][: len(gpu_labels)]]
        for j, cell in enumerate(row):
            if (cell == "X") != (i == j):
                raise TopologyParseError(f"{label} column GPU{j} is {cell!r}: the matrix is misaligned")
            if not _is_known_gpu_link(cell):
                raise TopologyParseError(f"unknown link {cell!r} between {label} and GPU{j}")
        links.append(row)
        extra = rows[label][len(devices) :]
        values = dict.fromkeys(AFFINITY_KEYS.values())
        for title, value in zip(trailing, extra):
            if title in AFFINITY_KEYS and value != "N/A":
                values[AFFINITY_KEYS[title]] = value
        affinity.append(values)

    legend = {}
    in_legend = False
    for line in lines:
        if line.strip() == "NIC Legend:":
            in_legend = True
            continue
        match = NIC_LEGEND_RE.match(line) if in_legend else None
        if match:
            legend[match.group(1)] = match.group(2)
    nics = [legend.get(label, label) for label in devices[len(gpu_labels) :]]
    unnamed = [label for label in nics if NIC_LABEL_RE.match(label)]
    if unnamed and legend:
        raise TopologyParseError(f"NIC Legend does not name {', '.join(unnamed)}")

    result = {"gpu_count": len(gpu_labels), "links": links, "nics": nics, "affinity": affinity}
    result.update(summarize_links(links))
    return result


def parse_gpu_query(text):
    """Parse `--query-gpu=index,name,pci.bus_id,memory.total --format=csv,noheader,nounits`.

    Returns a list of {index, name, memory_mib, pci_bus_id} ordered by index. The bus id and the memory are
    told apart by their shape, so index,name,memory.total,pci.bus_id parses too. Raises TopologyParseError.
    """
    gpus = []
    for line in strip_ansi(text or "").splitlines():
        if not line.strip():
            continue
        fields = [field.strip() for field in next(csv.reader([line], skipinitialspace=True))]
        if len(fields) != 4:
            raise TopologyParseError(f"expected 4 comma-separated fields, got {len(fields)}: {line!r}")
        index, name, third, fourth = fields
        if BUS_ID_RE.match(third) and fourth.isdigit():
            bus_id, memory = third, fourth
        elif BUS_ID_RE.match(fourth) and third.isdigit():
            bus_id, memory = fourth, third
        else:
            raise TopologyParseError(f"no PCI bus id and memory in MiB in {line!r}")
        if not index.isdigit():
            raise TopologyParseError(f"index {index!r} is not a number")
        if not name:
            raise TopologyParseError(f"GPU {index} has no name")
        gpus.append({"index": int(index), "name": name, "memory_mib": int(memory), "pci_bus_id": bus_id})
    if not gpus:
        raise TopologyParseError("no GPUs listed")
    gpus.sort(key=lambda gpu: gpu["index"])
    indexes = [gpu["index"] for gpu in gpus]
    if indexes != list(range(len(gpus))):
        raise TopologyParseError(f"GPU indexes are not 0..{len(gpus) - 1}: {indexes}")
    return gpus


# NCCL environment rules: the one place that decides `nccl_env`. Source: docs/operations.md, "NCCL on
# PCIe-only boxes". Every value is a default derived from the topology, never the last word: the roles
# combine it with per-host and per-group overrides, and the only trustworthy set is one measured on the box.
#
#   box                                    nccl_env
#   1 GPU                                  {}  no collectives between GPUs, nothing to tune
#   any two GPUs joined by NVLink (NV#)    {}  NCCL's defaults: the PCIe set below, measured on 2x H200 NV18,
#                                              ran a 64 MiB all-reduce 3.5x slower (271 -> 77 GB/s)
#   PCIe only, 2 GPUs or more              PCIE_TUNED_NCCL_ENV + NCCL_P2P_LEVEL=<worst GPU-GPU hop>
#     ... and no NIC rows in topo -m       + NCCL_IB_DISABLE=1
PCIE_TUNED_NCCL_ENV = (
    # (variable, value, why)
    (
        "NCCL_PROTO",
        "LL",
        "decode all-reduces are small (14 KiB-1 MiB); NCCL picks SIMPLE on PCIe, and LL raised bus bandwidth"
        " ~70% on 8x RTX PRO 6000 (Kimi-K2.5 decode 40 -> 65-68 tok/s)",
    ),
    ("NCCL_ALGO", "Ring", "Ring beat Tree on the hand-tuned 8-GPU PCIe unit"),
    ("NCCL_MAX_NCHANNELS", "16", "channel cap of the hand-tuned 8-GPU PCIe unit"),
    ("NCCL_BUFFSIZE", "16777216", "16 MiB buffers, as on the hand-tuned 8-GPU PCIe unit"),
    ("NCCL_NTHREADS", "512", "threads per channel, as on the hand-tuned 8-GPU PCIe unit"),
    (
        "CUDA_DEVICE_MAX_CONNECTIONS",
        "1",
        "one hardware work queue per device, as on the hand-tuned unit: kernels reach the GPU in launch"
        " order",
    ),
)
# NCCL_P2P_LEVEL: the worst hop present between two GPUs, so peer-to-peer covers every pair and goes no
# further (operations.md: a too-high level can deadlock).
# NCCL_IB_DISABLE=1: without an InfiniBand/RoCE NIC there is nothing for NCCL's IB transport to find.


def nccl_env_rule(topology):
    """single-gpu, nvlink or pcie: the row of the table above that applies."""
    if topology["gpu_count"] < 2:
        return "single-gpu"
    if topology["interconnect"] == "nvlink":
        return "nvlink"
    return "pcie"


def recommend_nccl_env(topology):
    """The recommended NCCL environment (str -> str) for a topology (parse_topo_matrix/build_topology)."""
    if nccl_env_rule(topology) != "pcie":
        return {}
    env = {name: value for name, value, _why in PCIE_TUNED_NCCL_ENV}
    env["NCCL_P2P_LEVEL"] = topology["worst_hop"]
    if not topology["nics"]:
        env["NCCL_IB_DISABLE"] = "1"
    return env


def build_topology(topo, gpus):
    """Join parse_topo_matrix() and parse_gpu_query() into the gpu_topology fact; raises on disagreement."""
    if topo["gpu_count"] != len(gpus):
        raise TopologyParseError(
            f"`nvidia-smi topo -m` shows {topo['gpu_count']} GPU(s)"
            f" but `nvidia-smi --query-gpu` lists {len(gpus)}"
        )
    merged = []
    for gpu, affinity in zip(gpus, topo["affinity"]):
        entry = dict(gpu)
        entry.update(affinity)
        merged.append(entry)
    topology = {
        "gpu_count": topo["gpu_count"],
        "gpus": merged,
        "interconnect": topo["interconnect"],
        "links": topo["links"],
        "worst_hop": topo["worst_hop"],
        "nvlink_min": topo["nvlink_min"],
        "nvlink_all_pairs": topo["nvlink_all_pairs"],
        "nics": topo["nics"],
    }
    topology["nccl_env_rule"] = nccl_env_rule(topology)
    topology["nccl_env"] = recommend_nccl_env(topology)
    return topology


def _resolve_binary(module, name):
    if "/" in name:
        if os.path.isfile(name) and os.access(name, os.X_OK):
            return name
        module.fail_json(msg=f"{name} not found or not executable: is the NVIDIA driver installed?")
    path = module.get_bin_path(name)
    if not path:
        module.fail_json(
            msg=f"{name} not found on {os.environ.get('PATH', '(no PATH)')}: is the NVIDIA driver installed?"
        )
    return path


def _run(module, binary, args):
    command = [binary] + args
    shown = " ".join([os.path.basename(binary)] + args)
    rc, out, err = module.run_command(command)
    if rc != 0:
        module.fail_json(
            msg=f"`{shown}` failed with rc={rc}: {excerpt(err or out)}", rc=rc, stdout=out, stderr=err
        )
    return shown, out


def main():
    health_options = {name: spec for name, spec in HEALTH_OPTIONS.items() if name != "nvidia_smi"}
    module = AnsibleModule(
        argument_spec={
            "nvidia_smi": HEALTH_OPTIONS["nvidia_smi"],
            "health": {"type": "dict", "options": health_options},
        },
        supports_check_mode=True,
    )
    binary = _resolve_binary(module, module.params["nvidia_smi"])

    topo_command, topo_out = _run(module, binary, TOPO_ARGS)
    query_command, query_out = _run(module, binary, QUERY_ARGS)

    try:
        topo = parse_topo_matrix(topo_out)
    except TopologyParseError as exc:
        module.fail_json(msg=f"cannot parse `{topo_command}`: {exc}; output: {excerpt(topo_out)}")
    try:
        gpus = parse_gpu_query(query_out)
    except TopologyParseError as exc:
        module.fail_json(msg=f"cannot parse `{query_command}`: {exc}; output: {excerpt(query_out)}")
    try:
        topology = build_topology(topo, gpus)
    except TopologyParseError as exc:
        module.fail_json(msg=f"{exc}; refusing to guess the topology")

    topology["nvidia_smi"] = binary
    facts = {"gpu_topology": topology}
    if module.params["health"] is not None:
        try:
            facts["gpu_health"] = read_gpu_health(module, binary, **module.params["health"])
        except HealthError as error:
            module.fail_json(msg=f"gpu_health: {error}")
    module.exit_json(changed=False, ansible_facts=facts)


if __name__ == "__main__":
    main()
