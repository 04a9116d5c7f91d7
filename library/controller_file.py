#!/usr/bin/python
"""Documentation of the controller_file action (action_plugins/controller_file.py): it runs no module."""

from __future__ import annotations

DOCUMENTATION = r"""
module: controller_file
short_description: Write a text file on the controller, atomically, without running a module
description:
  - Writes I(content) to I(dest) on the controller, creating its directory, through a temporary file in
    that directory that replaces I(dest) at once; a file with the same content is left as it is.
  - The action runs in the controller's own worker (action_plugins/controller_file.py), so a per-host
    report costs no Python process of its own, as M(ansible.builtin.copy) delegated to localhost would
    (two, its stat and its copy).
  - In check mode nothing is written; the result says whether the file would change.
options:
  dest:
    description: Path of the file on the controller.
    type: path
    required: true
  content:
    description: The file's text.
    type: str
    required: true
  mode:
    description: Permissions of a file written (and of a directory made), as an octal string.
    type: str
    default: "0644"
extends_documentation_fragment:
  - action_common_attributes
attributes:
  check_mode:
    support: full
  diff_mode:
    support: none
  platform:
    platforms: posix
author:
  - specfleet maintainers
"""

EXAMPLES = r"""
- name: Write the host's JSON report
  controller_file:
    dest: "{{ playbook_dir }}/reports/{{ inventory_hostname }}.json"
    content: "{{ gate_report | to_nice_json }}\n"
"""

RETURN = r"""
dest:
  description: Path of the file.
  returned: always
  type: str
"""
