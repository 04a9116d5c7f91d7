#!/usr/bin/python
"""Ansible facts module: what the driver and the kernel say about the GPUs' health before serving."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: gpu_health
short_description: Report GPU memory errors, pending row remapping, Xid errors, IOMMU translation and ACS
description:
  - Reads C(nvidia-smi -q -x) (one XML document for every GPU) and the kernel log (C(dmesg)), and
    for each GPU the IOMMU group type in sysfs; returns the C(gpu_health) fact with one entry per problem.
  - Problems that make a GPU unfit to serve (C(severity=error)) are uncorrectable ECC errors since the driver
    loaded (volatile), a row remapping that waits for a GPU reset (pending), a failed row remapping, a page
    retirement that waits for a reset, and Xid errors in the kernel log since the driver last loaded
    (since boot where its load line has left the log). Classified by NVIDIA's Xid catalogue, the ones whose
    action is restarting the application that hit them (8, 11, 13, 31, 43, 45, 94, a contained ECC error)
    and the memory events nvidia-smi reports itself (63, 64, row remapping; 92, corrected single-bit
    errors) are warnings.
  - IOMMU DMA translation on a GPU (group type C(DMA) or C(DMA-FQ), not C(identity)) is a C(warning),
    since NCCL's peer-to-peer traffic between PCIe GPUs goes through the IOMMU and can hang or crawl. The
    fix is in the message (boot with C(iommu=pt), or turn the IOMMU off).
  - PCIe Access Control Services that redirect peer-to-peer traffic (C(ReqRedir+), C(CmpltRedir+) or
    C(EgressCtrl+) in C(lspci -vvv)'s C(ACSCtl)) on a bridge above a GPU are a C(warning) too, for the same
    reason; the bridges are the GPU's parents in sysfs. The fix (BIOS, or C(setpci) until the next boot)
    is in the message. Without C(lspci) this part is skipped and said in C(acs).
  - "deploy.yml reads this fact through M(gpu_topology)'s I(health), in the topology's own call. On its own
    the module checks a fleet's GPUs without a deploy (C(ansible gpu_boxes -b -m gpu_health))."
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
          description: Xid events in the kernel log since the driver loaded, each with C(pci), C(code),
            C(kind) (C(application), C(recorded) or C(hardware), which stops a box), C(meaning), C(line).
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

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.gpu_health_facts import HEALTH_OPTIONS, HealthError, read_gpu_health


def main():
    module = AnsibleModule(argument_spec=HEALTH_OPTIONS, supports_check_mode=True)
    try:
        facts = read_gpu_health(module, **module.params)
    except HealthError as error:
        module.fail_json(msg=f"gpu_health: {error}")
    module.exit_json(changed=False, ansible_facts={"gpu_health": facts})


if __name__ == "__main__":
    main()
