"""What the driver and the kernel say about the GPUs' health (standard library only; the module's
run_command and get_bin_path are passed in). gpu_health returns it on its own, gpu_topology beside the
topology in the same call."""

import os
import re
import xml.etree.ElementTree as ElementTree

SYSFS_DEVICES = "/sys/bus/pci/devices"
PCI_ADDRESS = re.compile(r"^[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$")
# NVIDIA's Xid catalogue (docs.nvidia.com/deploy/xid-errors), by what an Xid asks of the box. Said, not a
# reason to take the box out: the ones whose immediate action is restarting the application that hit them
# (the GPU serves on), and the memory events whose state nvidia-smi reports itself (a row remapping that
# waits for a reset, one that failed: checked apart, from nvidia-smi -q). Every other Xid stops the box.
XID_CATALOGUE = {
    8: ("application", "GPU stopped processing: the application that hit it was ended"),
    11: ("application", "invalid or corrupted push buffer stream: an application's fault"),
    13: ("application", "graphics engine exception: an application's fault"),
    31: ("application", "GPU memory page fault: an application's fault"),
    43: ("application", "GPU stopped processing: an application's fault"),
    45: ("application", "preemptive cleanup: an application ended, or was ended"),
    63: ("recorded", "row remapping or page retirement recorded: a pending remap is read from nvidia-smi"),
    64: ("recorded", "row remapping or page retirement not recorded: a failed remap is read from nvidia-smi"),
    92: ("recorded", "high single-bit ECC error rate: corrected errors"),
    94: ("application", "contained ECC error: the application using that memory was ended"),
}
# The driver's load line (NVRM: loading NVIDIA UNIX [Open ]Kernel Module ...): an Xid before the last one
# belongs to a driver that has been unloaded since (a reset, an upgrade) and no longer says anything.
DRIVER_LOADED = re.compile(r"NVRM: loading NVIDIA UNIX")
# ACS controls that send peer-to-peer requests and completions up to the root complex, or block them.
ACS_REDIRECTS = ("ReqRedir+", "CmpltRedir+", "EgressCtrl+")
# NVRM: Xid (PCI:0000:01:00): 79, pid=..., GPU has fallen off the bus.
XID = re.compile(r"NVRM: Xid \(PCI:(?P<pci>[0-9a-fA-F:.]+)\): (?P<code>\d+)")
# gpu_health's options, and the suboptions of gpu_topology's health (documented in both modules).
HEALTH_OPTIONS = {
    "nvidia_smi": {"type": "str", "default": "nvidia-smi"},
    "gpus": {"type": "list", "elements": "str", "default": []},
    "lspci": {"type": "str", "default": "lspci"},
}
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
    """The Xid events since the driver last loaded (since boot where its load line has left the log)."""
    lines = kernel_log.splitlines()
    loads = [index for index, line in enumerate(lines) if DRIVER_LOADED.search(line)]
    xids = []
    for line in lines[loads[-1] + 1 :] if loads else lines:
        match = XID.search(line)
        if match:
            code = int(match.group("code"))
            kind, meaning = XID_CATALOGUE.get(
                code, ("hardware", "not an application's: see NVIDIA's Xid catalogue")
            )
            xids.append(
                {
                    "pci": match.group("pci").lower(),
                    "code": code,
                    "kind": kind,
                    "meaning": meaning,
                    "line": line.strip(),
                }
            )
    return xids


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
        add(
            xid["pci"],
            "xid",
            "error" if xid["kind"] == "hardware" else "warning",
            f"Xid {xid['code']} on PCI {xid['pci']} since the driver loaded ({xid['meaning']}): "
            + xid["line"],
        )
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


def read_gpu_health(module, nvidia_smi="nvidia-smi", gpus=(), lspci="lspci"):
    """The gpu_health fact (library/gpu_health.py documents it), read with the module's run_command;
    HealthError says in one line why nvidia-smi could not be read."""
    binary = nvidia_smi
    if "/" not in nvidia_smi:
        binary = module.get_bin_path(nvidia_smi, opt_dirs=["/usr/sbin", "/sbin"])
    if binary is None or not os.path.exists(binary):
        raise HealthError(f"{nvidia_smi} not found")
    rc, out, err = module.run_command([binary, "-q", "-x"])
    if rc != 0:
        raise HealthError(f"{nvidia_smi} -q -x failed (rc={rc}): {(err or out).strip()}")
    found = parse_query(out)
    dmesg = module.get_bin_path("dmesg")
    rc, log, err = module.run_command([dmesg]) if dmesg else (1, "", "dmesg not found")
    kernel_log = "read" if rc == 0 else f"not readable: {(err or log).strip()}"
    xids = parse_xid(log) if rc == 0 else []
    iommu = iommu_types(gpus)
    bridges = {gpu: upstream_bridges(gpu) for gpu in gpus}
    acs = {}
    lspci = module.get_bin_path(lspci)
    for bridge in sorted({bridge for above in bridges.values() for bridge in above}):
        rc, block, _ = module.run_command([lspci, "-vvv", "-s", bridge]) if lspci else (1, "", "")
        acs[bridge] = (parse_acs(block) or "none") if rc == 0 else "unknown (no lspci)"
    return {
        "gpus": found,
        "xid": xids,
        "kernel_log": kernel_log,
        "iommu": iommu,
        "acs": acs,
        "problems": problems(found, xids, iommu, acs, bridges),
    }
