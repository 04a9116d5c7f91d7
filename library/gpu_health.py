#!/usr/bin/python
"""Ansible facts module: what the driver and the kernel say about the GPUs' health before serving."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: gpu_health
short_description: Report GPU memory errors, pending row remapping, Xid errors, IOMMU translation and ACS
description:
  - Reads C(nvidia-smi -q -x) (one XML document for every GPU) and the kernel log since boot (C(dmesg)), and
    for each GPU the IOMMU group type in sysfs; returns the C(gpu_health) fact with one entry per problem.
  - Problems that make a GPU unfit to serve (C(severity=error)) are uncorrectable ECC errors since the driver
    loaded (volatile), a row remapping that waits for a GPU reset (pending), a failed row remapping, a page
    retirement that waits for a reset, and Xid errors in the kernel log since boot (those NVIDIA's Xid
    catalogue puts down to an application, 13, 31, 43 and 45, are warnings).
  - IOMMU DMA translation on a GPU (group type C(DMA) or C(DMA-FQ), not C(identity)) is a C(warning),
    since NCCL's peer-to-peer traffic between PCIe GPUs goes through the IOMMU and can hang or crawl. The
    fix is in the message (boot with C(iommu=pt), or turn the IOMMU off).
  - PCIe Access Control Services that redirect peer-to-peer traffic (C(ReqRedir+), C(CmpltRedir+) or
    C(EgressCtrl+) in C(lspci -vvv)'s C(ACSCtl)) on a bridge above a GPU are a C(warning) too, for the same
    reason; the bridges are the GPU's parents in sysfs. The fix (BIOS, or C(setpci) until the next boot)
    is in the message. Without C(lspci) this part is skipped and said in C(acs).
  - Changes nothing on the host; C(changed) is always C(false).
options:
  nvidia_smi:
    description: The C(nvidia-smi) to run; a bare name is looked up on the host's E(PATH).
    type: str
    default: nvidia-smi
  gpus:
    description: The GPUs' PCI addresses (C(gpu_bus.gpus[].address)), whose IOMMU groups are read.
    type: list
    elements: str
    default: []
  lspci:
    description: The C(lspci) to read the bridges' ACS state with; a bare name is looked up on E(PATH).
    type: str
    default: lspci
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
  - A kernel log that cannot be read (C(dmesg) refused, as in an unprivileged container) is reported in
    C(kernel_log), not as a problem.
  - Fails with one line when C(nvidia-smi -q -x) fails or prints something that is not its XML.
author:
  - specfleet maintainers
"""

EXAMPLES = r"""
- name: Read the GPUs' health
  gpu_health:
    gpus: "{{ gpu_bus.gpus | map(attribute='address') }}"

- name: Stop on a GPU that is unfit to serve
  ansible.builtin.assert:
    that: ansible_facts.gpu_health.problems | selectattr('severity', 'eq', 'error') | list | length == 0
    fail_msg: "{{ ansible_facts.gpu_health.problems | map(attribute='message') | join('; ') }}"
"""

RETURN = r"""
ansible_facts:
  description: Facts added to C(ansible_facts).
  returned: always
  type: dict
  contains:
    gpu_health:
      description: The GPUs' health.
      type: dict
      contains:
        gpus:
          description:
            - One entry per GPU of C(nvidia-smi -q -x) with C(bus_id), C(name), C(volatile_uncorrectable),
              C(aggregate_uncorrectable) (ECC, DRAM and SRAM together; null without ECC),
              C(remapped_rows_uncorrectable), C(remap_pending), C(remap_failure), C(retirement_pending).
          type: list
          elements: dict
        xid:
          description: Xid events in the kernel log since boot, each with C(pci) and C(code) and the C(line).
          type: list
          elements: dict
        kernel_log:
          description: C(read), or why it could not be read.
          type: str
        iommu:
          description: Per GPU address, its IOMMU group type (C(identity), C(DMA), C(DMA-FQ)), or C(off).
          type: dict
        acs:
          description: Per bridge above a GPU, its C(ACSCtl) line (C(none) without the capability).
          type: dict
        problems:
          description: Each with C(gpu), C(kind), C(severity) (C(error), C(warning)), a one-line C(message).
          type: list
          elements: dict
"""

import os
import re
import xml.etree.ElementTree as ElementTree

from ansible.module_utils.basic import AnsibleModule

SYSFS_DEVICES = "/sys/bus/pci/devices"
PCI_ADDRESS = re.compile(r"^[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$")
# Xids NVIDIA's catalogue puts down to a user application (graphics engine exception, GPU memory page
# fault, GPU stopped processing, preemptive cleanup): said, not a reason to take the box out.
APPLICATION_XIDS = {13, 31, 43, 45}
# ACS controls that send peer-to-peer requests and completions up to the root complex, or block them.
ACS_REDIRECTS = ("ReqRedir+", "CmpltRedir+", "EgressCtrl+")
# NVRM: Xid (PCI:0000:01:00): 79, pid=..., GPU has fallen off the bus.
XID = re.compile(r"NVRM: Xid \(PCI:(?P<pci>[0-9a-fA-F:.]+)\): (?P<code>\d+)")
UNCORRECTABLE_FIELDS = (
    "dram_uncorrectable",
    "sram_uncorrectable",
    "sram_uncorrectable_parity",
    "sram_uncorrectable_secded",
)


class HealthError(Exception):
    """What stops the read, in one line."""


def number(element, path):
    """An integer field, or None where nvidia-smi says N/A (no ECC, a GPU without the feature)."""
    node = element.find(path)
    if node is None or node.text is None:
        return None
    text = node.text.strip()
    return int(text) if text.isdigit() else None


def flag(element, path):
    node = element.find(path)
    return node is not None and (node.text or "").strip() == "Yes"


def uncorrectable(gpu, counter):
    values = [number(gpu, f"ecc_errors/{counter}/{field}") for field in UNCORRECTABLE_FIELDS]
    known = [value for value in values if value is not None]
    return sum(known) if known else None


def parse_query(xml_text):
    """Per-GPU health from `nvidia-smi -q -x`."""
    try:
        root = ElementTree.fromstring(xml_text)
    except ElementTree.ParseError as error:
        raise HealthError(f"nvidia-smi -q -x printed something that is not XML ({error})") from error
    gpus = []
    for gpu in root.findall("gpu"):
        gpus.append(
            {
                "bus_id": gpu.get("id", ""),
                "name": (gpu.findtext("product_name") or "").strip(),
                "volatile_uncorrectable": uncorrectable(gpu, "volatile"),
                "aggregate_uncorrectable": uncorrectable(gpu, "aggregate"),
                "remapped_rows_uncorrectable": number(gpu, "remapped_rows/remapped_row_unc"),
                "remap_pending": flag(gpu, "remapped_rows/remapped_row_pending"),
                "remap_failure": flag(gpu, "remapped_rows/remapped_row_failure"),
                "retirement_pending": flag(gpu, "retired_pages/pending_retirement"),
            }
        )
    return gpus


def parse_xid(kernel_log):
    return [
        {"pci": match.group("pci").lower(), "code": int(match.group("code")), "line": line.strip()}
        for line in kernel_log.splitlines()
        for match in [XID.search(line)]
        if match
    ]


def iommu_types(addresses, devices=None):
    devices = devices or SYSFS_DEVICES
    types = {}
    for address in addresses:
        group = os.path.join(devices, address, "iommu_group")
        try:
            with open(os.path.join(group, "type")) as handle:
                types[address] = handle.read().strip()
        except FileNotFoundError:
            # No group: the IOMMU is off (or the kernel predates the type file, 5.11).
            types[address] = "off" if not os.path.exists(group) else "unknown"
    return types


def upstream_bridges(address, devices=None):
    """The PCI bridges between a GPU and its root complex, nearest first (its parents in sysfs)."""
    path = os.path.join(devices or SYSFS_DEVICES, address)
    if not os.path.exists(path):
        return []
    parents = [part for part in os.path.realpath(path).split(os.sep) if PCI_ADDRESS.match(part)]
    return list(reversed(parents[:-1]))


def parse_acs(lspci_vvv):
    """The ACSCtl flags of one device's `lspci -vvv` block ("" without the capability)."""
    match = re.search(r"^\s*ACSCtl:\s*(.+)$", lspci_vvv, re.MULTILINE)
    return match.group(1).strip() if match else ""


def problems(gpus, xids, iommu, acs=None, bridges=None):
    found = []

    def add(gpu, kind, severity, message):
        found.append({"gpu": gpu, "kind": kind, "severity": severity, "message": message})

    for gpu in gpus:
        where = f"GPU {gpu['bus_id']} ({gpu['name']})"
        if gpu["volatile_uncorrectable"]:
            add(
                gpu["bus_id"],
                "ecc",
                "error",
                f"{where}: {gpu['volatile_uncorrectable']} uncorrectable ECC errors since the driver loaded",
            )
        if gpu["remap_pending"]:
            add(
                gpu["bus_id"],
                "row_remap",
                "error",
                f"{where}: a row remapping waits for a GPU reset (nvidia-smi -r or a reboot)",
            )
        if gpu["remap_failure"]:
            add(
                gpu["bus_id"],
                "row_remap",
                "error",
                f"{where}: row remapping failed (no spare rows left): the GPU needs service",
            )
        if gpu["retirement_pending"]:
            add(
                gpu["bus_id"], "page_retirement", "error", f"{where}: a page retirement waits for a GPU reset"
            )
    for xid in xids:
        severity = "warning" if xid["code"] in APPLICATION_XIDS else "error"
        add(xid["pci"], "xid", severity, f"Xid {xid['code']} on PCI {xid['pci']} since boot: {xid['line']}")
    for address, kind in iommu.items():
        if kind.startswith("DMA"):
            add(
                address,
                "iommu",
                "warning",
                f"GPU {address}: the IOMMU translates its DMA (group type {kind}); NCCL peer-to-peer between "
                "PCIe GPUs can hang or crawl: boot with iommu=pt (passthrough), or intel_iommu=off / "
                "amd_iommu=off",
            )
    for gpu, above in (bridges or {}).items():
        for bridge in above:
            control = (acs or {}).get(bridge, "")
            if any(flag in control.split() for flag in ACS_REDIRECTS):
                add(
                    bridge,
                    "acs",
                    "warning",
                    f"bridge {bridge} above GPU {gpu} redirects peer-to-peer traffic (ACSCtl: {control}); "
                    "NCCL peer-to-peer between PCIe GPUs goes through the root complex and can hang: disable "
                    f"ACS in the BIOS, or until the next boot: setpci -s {bridge} ECAP_ACS+0x6.w=0000",
                )
    return found


def main():
    module = AnsibleModule(
        argument_spec={
            "nvidia_smi": {"type": "str", "default": "nvidia-smi"},
            "gpus": {"type": "list", "elements": "str", "default": []},
            "lspci": {"type": "str", "default": "lspci"},
        },
        supports_check_mode=True,
    )
    smi = module.params["nvidia_smi"]
    binary = smi if "/" in smi else module.get_bin_path(smi, opt_dirs=["/usr/sbin", "/sbin"])
    try:
        if binary is None or not os.path.exists(binary):
            raise HealthError(f"{smi} not found")
        rc, out, err = module.run_command([binary, "-q", "-x"])
        if rc != 0:
            raise HealthError(f"{smi} -q -x failed (rc={rc}): {(err or out).strip()}")
        gpus = parse_query(out)
    except HealthError as error:
        module.fail_json(msg=f"gpu_health: {error}")
    dmesg = module.get_bin_path("dmesg")
    rc, log, err = module.run_command([dmesg]) if dmesg else (1, "", "dmesg not found")
    kernel_log = "read" if rc == 0 else f"not readable: {(err or log).strip()}"
    xids = parse_xid(log) if rc == 0 else []
    iommu = iommu_types(module.params["gpus"])
    bridges = {gpu: upstream_bridges(gpu) for gpu in module.params["gpus"]}
    acs = {}
    lspci = module.get_bin_path(module.params["lspci"])
    for bridge in sorted({bridge for above in bridges.values() for bridge in above}):
        rc, block, _ = module.run_command([lspci, "-vvv", "-s", bridge]) if lspci else (1, "", "")
        acs[bridge] = (parse_acs(block) or "none") if rc == 0 else "unknown (no lspci)"
    facts = {
        "gpus": gpus,
        "xid": xids,
        "kernel_log": kernel_log,
        "iommu": iommu,
        "acs": acs,
        "problems": problems(gpus, xids, iommu, acs, bridges),
    }
    module.exit_json(changed=False, ansible_facts={"gpu_health": facts})


if __name__ == "__main__":
    main()
