#!/usr/bin/python
"""Documentation of the role_arguments action (action_plugins/role_arguments.py): it runs no module."""

from __future__ import annotations

DOCUMENTATION = r"""
module: role_arguments
short_description: Check the inventory's values against the argument specs of every role the play runs
description:
  - Reads the C(main) entry point of C(meta/argument_specs.yml) of each role the play imports, as Ansible
    itself loaded the role (its roles path, not a path relative to another role), and checks the play's
    values of those options in one call (types, choices, required values); one line names every value
    that fails.
  - Runs in the controller's own worker and contacts no box, so that roles/validate_inventory checks a
    whole inventory before the first SSH connection. A value whose default derives from what is read on
    the box (the GPUs on its PCI bus) cannot be known yet; it is returned in C(deferred), to be checked
    again with I(only) once that is read.
options:
  skip:
    description: Roles of the play whose arguments are not checked (the simulation's own, for example).
    type: list
    elements: str
    default: []
  only:
    description: Check these options only (those deferred by an earlier call, once the box's facts are known);
      all of them when empty.
    type: list
    elements: str
    default: []
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
- name: Check the arguments of every role of the play
  role_arguments:
  register: checked

- name: Check the ones that needed the box's PCI bus, once it is read
  role_arguments:
    only: "{{ checked.deferred }}"
  when: checked.deferred | length > 0
"""

RETURN = r"""
roles:
  description: The roles whose arguments were checked.
  returned: always
  type: list
  elements: str
deferred:
  description: Options whose value derives from what is read on the box, not checked in this call.
  returned: always
  type: list
  elements: str
argument_errors:
  description: One line per value that fails its role's argument spec.
  returned: when a value fails
  type: list
  elements: str
"""
