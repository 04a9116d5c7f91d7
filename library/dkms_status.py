#!/usr/bin/python
"""Ansible facts module: which installed kernels a DKMS module (the NVIDIA driver's) is built for."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: dkms_status
short_description: Report the kernels a DKMS module is missing for, above all the one the box boots next
description:
  - Runs C(dkms status) and lists the installed kernels (C(/boot/vmlinuz-*)); returns the C(dkms_status)
    fact.
  - After a kernel package update, DKMS builds the NVIDIA module for the new kernel only when that kernel's
    headers are installed; otherwise the box boots a kernel the driver cannot load into. C(dkms status)
    prints nothing for such a kernel (no line at all), so the module compares its lines with the installed
    kernels instead of looking for an error.
  - The kernel booted next is the one C(/vmlinuz) (Debian) or C(/boot/vmlinuz) (Ubuntu) points at, else the
    newest installed one.
  - Changes nothing on the host; C(changed) is always C(false). A box without C(dkms) returns
    C(available=false) and nothing else.
options:
  module:
    description: The DKMS module name, as C(dkms status) prints it before the slash.
    type: str
    default: nvidia
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
  - Reads the stdout of C(dkms status) only; its stderr carries noise on some kernels (C(readelf) warnings)
    and is returned as C(warnings_text).
author:
  - specfleet maintainers
"""

EXAMPLES = r"""
- name: Which kernels the NVIDIA module is built for
  dkms_status:

- name: Stop before a reboot into a kernel without the module
  ansible.builtin.assert:
    that: not ansible_facts.dkms_status.missing_for_next_kernel
"""

RETURN = r"""
ansible_facts:
  description: Facts added to C(ansible_facts).
  returned: always
  type: dict
  contains:
    dkms_status:
      description: The module's DKMS builds against the installed kernels.
      type: dict
      contains:
        available:
          description: Whether C(dkms) is installed.
          type: bool
        entries:
          description:
            - Every line of C(dkms status) as C(module), C(version), C(kernel) (empty for C(added)), C(arch),
              C(state) (C(added), C(built), C(installed), ...) and C(note) (what follows the state, if any).
          type: list
          elements: dict
        versions:
          description: The versions of I(module) DKMS knows.
          type: list
          elements: str
        installed_kernels:
          description: Kernel releases with an image in C(/boot), oldest first.
          type: list
          elements: str
        running_kernel:
          description: The kernel running now.
          type: str
        next_kernel:
          description: The kernel the box boots next ("" when C(/boot) has no image, as in a container).
          type: str
        kernels_without_module:
          description: Installed kernels I(module) is not installed for.
          type: list
          elements: str
        missing_for_next_kernel:
          description: Whether I(module) is known to DKMS but not installed for C(next_kernel).
          type: bool
        warnings_text:
          description: What C(dkms status) wrote to stderr.
          type: str
"""

import os
import re

from ansible.module_utils.basic import AnsibleModule

# dkms 3: "nvidia/575.57.08, 6.1.0-50-amd64, x86_64: installed"; dkms 2: "nvidia, 575.57.08, 6.1.0-50-amd64,
# x86_64: installed"; a module added but not built: "nvidia/575.57.08: added".
STATUS_LINE = re.compile(
    r"^(?P<module>[^/,\s]+)(?:/|, )(?P<version>[^,:\s]+)"
    r"(?:, (?P<kernel>[^,\s]+), (?P<arch>[^:\s]+))?: (?P<state>[a-z]+)(?:[ ,]+(?P<note>.*))?$"
)
BOOT = "/boot"
NEXT_KERNEL_LINKS = ("/vmlinuz", "/boot/vmlinuz")


def parse_status(text):
    """The entries of `dkms status` stdout; lines of another shape are left out."""
    entries = []
    for line in text.splitlines():
        match = STATUS_LINE.match(line.strip())
        if match:
            entry = {key: value or "" for key, value in match.groupdict().items()}
            entries.append(entry)
    return entries


def release_key(release):
    """Sort key for kernel releases: numbers compare as numbers (6.1.0-57 < 6.12.118)."""
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", release)]


def installed_kernels(boot=BOOT):
    if not os.path.isdir(boot):
        return []
    names = [name[len("vmlinuz-") :] for name in os.listdir(boot) if name.startswith("vmlinuz-")]
    return sorted(names, key=release_key)


def next_kernel(kernels, links=NEXT_KERNEL_LINKS):
    for link in links:
        if os.path.islink(link):
            target = os.path.basename(os.readlink(link))
            if target.startswith("vmlinuz-") and target[len("vmlinuz-") :] in kernels:
                return target[len("vmlinuz-") :]
    return kernels[-1] if kernels else ""


def summarize(entries, module, kernels, following, running):
    mine = [entry for entry in entries if entry["module"] == module]
    built_for = {entry["kernel"] for entry in mine if entry["state"] == "installed"}
    without = [kernel for kernel in kernels if kernel not in built_for]
    return {
        "available": True,
        "entries": entries,
        "versions": sorted({entry["version"] for entry in mine}),
        "installed_kernels": kernels,
        "running_kernel": running,
        "next_kernel": following,
        "kernels_without_module": without,
        "missing_for_next_kernel": bool(mine) and bool(following) and following not in built_for,
    }


def main():
    module = AnsibleModule(
        argument_spec={"module": {"type": "str", "default": "nvidia"}}, supports_check_mode=True
    )
    dkms = module.get_bin_path("dkms")
    if dkms is None:
        module.exit_json(changed=False, ansible_facts={"dkms_status": {"available": False}})
    rc, out, err = module.run_command([dkms, "status"])
    if rc != 0:
        module.fail_json(msg=f"dkms status failed (rc={rc}): {(err or out).strip()}")
    kernels = installed_kernels()
    facts = summarize(
        parse_status(out), module.params["module"], kernels, next_kernel(kernels), os.uname().release
    )
    facts["warnings_text"] = err.strip()
    module.exit_json(changed=False, ansible_facts={"dkms_status": facts})


if __name__ == "__main__":
    main()
