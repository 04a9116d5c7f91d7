#!/usr/bin/python
"""Ansible facts module: the NVIDIA GPUs and NVSwitches on the PCI bus, read without any driver."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: gpu_bus
short_description: Find the NVIDIA GPUs and NVSwitches on the PCI bus, before any driver is installed
description:
  - Lists the box's PCI functions with C(lspci -Dnn), or, where C(lspci) is not installed (minimal cloud
    images), from C(/sys/bus/pci/devices/*/{vendor,device,class}) with names from the C(pci.ids) database
    when the box has one. Neither needs the NVIDIA driver.
  - Returns the C(gpu_bus) fact. A GPU is an NVIDIA (vendor C(10de)) VGA or 3D controller (class C(0300) or
    C(0302)); the audio, USB and serial functions of consumer cards are not GPUs. An NVSwitch is an NVIDIA
    C(0680) bridge of the NVSwitch era (NVIDIA's nForce chipsets used the same class for their Ethernet).
  - Decides what the driver install needs to know up front. C(kernel_modules) is C(open) unless a GPU
    predates Turing, which only the proprietary modules drive; the open ones are NVIDIA's default since 560
    and the only ones for Blackwell. C(fabric_manager) is true when NVSwitches are on the bus (an HGX/DGX
    board, where the GPUs do not come up without it).
  - Changes nothing on the host; C(changed) is always C(false).
options:
  lspci:
    description:
      - The C(lspci) binary to run. A bare name is looked up on the host's E(PATH); when it is not found
        there, the module reads sysfs instead. A path (anything containing C(/)) must exist.
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
  - Fails with one line when C(lspci) exits non-zero or prints a line it cannot read. Finding no NVIDIA GPU
    is not a failure of the module; deploy.yml's preflight stops on it.
author:
  - specfleet maintainers
"""

EXAMPLES = r"""
- name: Find the GPUs on the PCI bus (no driver needed)
  gpu_bus:

- name: Stop when the bus shows another number of GPUs than the inventory
  ansible.builtin.assert:
    that: ansible_facts.gpu_bus.gpu_count == 8
    fail_msg: "the PCI bus shows {{ ansible_facts.gpu_bus.gpu_count }} NVIDIA GPUs, not 8"
"""

RETURN = r"""
ansible_facts:
  description: Facts added to C(ansible_facts).
  returned: always
  type: dict
  contains:
    gpu_bus:
      description: The NVIDIA devices on the PCI bus.
      type: dict
      contains:
        source:
          description: Where the list came from, C(lspci) or C(sysfs).
          type: str
          sample: lspci
        gpus:
          description:
            - One entry per GPU, in bus order, with C(address), C(device_id) (4 hex digits), C(class)
              (C(0300) or C(0302)), C(chip) (e.g. C(AD102), empty when unknown) and C(name) (the marketing
              name, or C(device <id>) when the PCI database does not know the card yet).
          type: list
          elements: dict
          sample:
            - {address: "0000:01:00.0", device_id: "2684", class: "0300", chip: AD102, name: GeForce RTX 4090}
        gpu_count:
          description: Number of GPUs.
          type: int
          sample: 8
        nvswitches:
          description: The NVSwitch devices, with the same keys as C(gpus).
          type: list
          elements: dict
        other_functions:
          description: NVIDIA functions that are neither (consumer cards' HDMI audio, USB-C, old chipsets).
          type: list
          elements: dict
        pre_turing:
          description: Names of the GPUs older than Turing.
          type: list
          elements: str
        kernel_modules:
          description: C(open), or C(proprietary) when a GPU predates Turing.
          type: str
          sample: open
        fabric_manager:
          description: Whether NVSwitches are on the bus, so the box needs NVIDIA's fabric manager.
          type: bool
          sample: false
"""

import os
import re
import shutil

from ansible.module_utils.basic import AnsibleModule

NVIDIA = "10de"
GPU_CLASSES = ("0300", "0302")  # VGA compatible controller, 3D controller
BRIDGE_OTHER = "0680"
# NVIDIA numbers its chips upward by generation: Turing's first device id is 0x1e02 (TU102); Volta
# (GV100, 0x1db*), Pascal and older are below 0x1e00.
FIRST_TURING_DEVICE_ID = 0x1E00
# NVSwitches (0x1ac0 on) share class 0680 with the Ethernet of NVIDIA's nForce chipsets (0x0269, ...).
FIRST_NVSWITCH_DEVICE_ID = 0x1000
SYSFS_DEVICES = "/sys/bus/pci/devices"
PCI_IDS = ("/usr/share/misc/pci.ids", "/usr/share/hwdata/pci.ids", "/usr/share/pci.ids")

# 0000:1b:00.0 3D controller [0302]: NVIDIA Corporation GH100 [H100 SXM5 80GB] [10de:2330] (rev a1)
LSPCI_LINE = re.compile(
    r"^(?P<address>[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]) .+? \[(?P<class>[0-9a-f]{4})\]: "
    r"(?P<description>.*?) ?\[(?P<vendor>[0-9a-f]{4}):(?P<device>[0-9a-f]{4})\](?: \(rev [0-9a-f]+\))?"
    r"(?: \(prog-if [^)]*\))?$"
)
# "GH100 [H100 SXM5 80GB]": the chip, then the marketing name in brackets.
CHIP_AND_NAME = re.compile(r"^(?P<chip>\S+) \[(?P<name>.+)\]$")


class BusError(Exception):
    """What stops the read, in one line."""


def describe(device_id, description):
    """Chip and name from the vendor-less description lspci or pci.ids gives ("" when unknown)."""
    match = CHIP_AND_NAME.match(description)
    if match:
        return match.group("chip"), match.group("name")
    if description and description != "Device":
        return "", description
    return "", f"device {device_id}"


def parse_lspci(text):
    """[(address, class, vendor, device, vendor-less description)] from `lspci -Dnn` output."""
    functions = []
    for line in text.splitlines():
        if not line.strip():
            continue
        match = LSPCI_LINE.match(line)
        if not match:
            raise BusError(f"lspci -Dnn printed a line that is not a PCI function: {line!r}")
        description = match.group("description")
        if match.group("vendor") == NVIDIA:
            description = re.sub(r"^NVIDIA Corporation ?", "", description, flags=re.IGNORECASE)
        functions.append((*match.group("address", "class", "vendor", "device"), description))
    return functions


def nvidia_names(paths=PCI_IDS):
    """{device id: description} of vendor 10de from the first pci.ids the box has ({} when none)."""
    for path in paths:
        if not os.path.exists(path):
            continue
        names, in_nvidia = {}, False
        with open(path, encoding="utf-8", errors="replace") as handle:
            for line in handle:
                if not line.startswith("\t"):
                    in_nvidia = line.startswith(NVIDIA + "  ")
                    if names and not in_nvidia:
                        break
                elif in_nvidia and not line.startswith("\t\t"):
                    device, _, description = line.strip().partition("  ")
                    names[device.lower()] = description
        return names
    return {}


def read_sysfs(devices=SYSFS_DEVICES, names=None):
    """The same tuples as parse_lspci, from sysfs (vendor 0x10de, device 0x2335, class 0x030200)."""
    names = nvidia_names() if names is None else names

    def read(address, attribute):
        with open(os.path.join(devices, address, attribute)) as handle:
            return handle.read().strip().lower().removeprefix("0x")

    functions = []
    for address in sorted(os.listdir(devices)):
        vendor, device = read(address, "vendor"), read(address, "device")
        description = names.get(device, "") if vendor == NVIDIA else ""
        functions.append((address, read(address, "class")[:4], vendor, device, description))
    return functions


def classify(functions, source):
    """The gpu_bus fact from the PCI functions."""
    gpus, nvswitches, others = [], [], []
    for address, pci_class, vendor, device, description in functions:
        if vendor != NVIDIA:
            continue
        chip, name = describe(device, description)
        entry = {"address": address, "device_id": device, "class": pci_class, "chip": chip, "name": name}
        if pci_class in GPU_CLASSES:
            gpus.append(entry)
        elif pci_class == BRIDGE_OTHER and int(device, 16) >= FIRST_NVSWITCH_DEVICE_ID:
            nvswitches.append(entry)
        else:
            others.append(entry)
    pre_turing = [gpu["name"] for gpu in gpus if int(gpu["device_id"], 16) < FIRST_TURING_DEVICE_ID]
    return {
        "source": source,
        "gpus": gpus,
        "gpu_count": len(gpus),
        "nvswitches": nvswitches,
        "other_functions": others,
        "pre_turing": pre_turing,
        "kernel_modules": "proprietary" if pre_turing else "open",
        "fabric_manager": bool(nvswitches),
    }


def main():
    module = AnsibleModule(
        argument_spec={"lspci": {"type": "str", "default": "lspci"}}, supports_check_mode=True
    )
    lspci = module.params["lspci"]
    binary = lspci if "/" in lspci else shutil.which(lspci)
    try:
        if binary is None:
            facts = classify(read_sysfs(), "sysfs")
        else:
            if not os.path.exists(binary):
                raise BusError(f"{lspci} not found")
            rc, out, err = module.run_command([binary, "-Dnn"])
            if rc != 0:
                raise BusError(f"{lspci} -Dnn failed (rc={rc}): {(err or out).strip()}")
            facts = classify(parse_lspci(out), "lspci")
    except (BusError, OSError) as error:
        module.fail_json(msg=f"gpu_bus: {error}")
    module.exit_json(changed=False, ansible_facts={"gpu_bus": facts})


if __name__ == "__main__":
    main()
