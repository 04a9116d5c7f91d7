#!/usr/bin/python
"""Ansible module: a small file written from the content the controller gives, in one call to the box."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: content_file
short_description: Write a small file from given content in one call, only where it differs
description:
  - "Writes I(content) to I(path) where the file's bytes differ (a temporary file in the same directory,
    moved over it: a reader sees the old file or the new one), and sets I(mode), I(owner) and I(group)
    where they differ. A missing parent directory is made with I(directory_mode). With C(state=absent)
    the file is removed."
  - "What C(ansible.builtin.copy) with C(content) does with two calls to the box (a stat, then the copy
    or a file check), this does with one, also in a run that changes nothing."
  - "A new file gets its mode before its content: content that is a secret (with the task's C(no_log))
    is never readable by others, not even for a moment."
options:
  path:
    description: Where the file goes.
    type: path
    required: true
  content:
    description: The file's text; required with C(state=present).
    type: str
  mode:
    description: The file's mode, in octal.
    type: str
    default: "0644"
  owner:
    description: The file's owner; the user the module runs as when omitted.
    type: str
  group:
    description: The file's group; that user's group when omitted.
    type: str
  state:
    description: Whether the file is there.
    type: str
    choices: [present, absent]
    default: present
  directory_mode:
    description: Mode of a parent directory that has to be made.
    type: str
    default: "0755"
extends_documentation_fragment:
  - action_common_attributes
attributes:
  check_mode:
    support: full
  diff_mode:
    support: full
  platform:
    platforms: posix
author:
  - specfleet maintainers
"""

EXAMPLES = r"""
- name: A systemd unit rendered on the controller
  content_file:
    path: /etc/systemd/system/vllm.service
    content: "{{ lookup('ansible.builtin.template', 'vllm.service.j2') }}"
  notify: vllm restart

- name: A root-only environment file with the API key
  content_file:
    path: /etc/vllm/vllm.env
    content: "VLLM_API_KEY={{ vllm_api_key }}\n"
    mode: "0600"
  no_log: true
"""

RETURN = r"""
path:
  description: The file.
  returned: success
  type: str
"""

import os
import tempfile

from ansible.module_utils.basic import AnsibleModule


def current_bytes(path):
    """The file's bytes, or None when there is no file."""
    try:
        with open(path, "rb") as stream:
            return stream.read()
    except FileNotFoundError:
        return None


def write(module, data):
    path, directory = module.params["path"], os.path.dirname(module.params["path"])
    if not os.path.isdir(directory):
        os.makedirs(directory, mode=int(module.params["directory_mode"], 8))
    if not os.path.exists(path):
        # An empty file with the final mode first: atomic_move gives the new content the mode of the file
        # it replaces (a file it creates would get the umask's).
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, int(module.params["mode"], 8)))
    handle, temporary = tempfile.mkstemp(dir=directory, prefix=f".{os.path.basename(path)}.")
    with os.fdopen(handle, "wb") as stream:
        stream.write(data)
    module.atomic_move(temporary, path)


def main():
    module = AnsibleModule(
        argument_spec={
            "path": {"type": "path", "required": True},
            "content": {"type": "str"},
            "mode": {"type": "str", "default": "0644"},
            "owner": {"type": "str"},
            "group": {"type": "str"},
            "state": {"type": "str", "choices": ["present", "absent"], "default": "present"},
            "directory_mode": {"type": "str", "default": "0755"},
        },
        required_if=[["state", "present", ["content"]]],
        supports_check_mode=True,
    )
    params = module.params
    path = params["path"]
    result = {"changed": False, "path": path}
    try:
        before = current_bytes(path)
        if params["state"] == "absent":
            result["changed"] = before is not None
            if result["changed"] and not module.check_mode:
                os.remove(path)
            module.exit_json(**result)
        data = params["content"].encode()
        result["changed"] = before != data
        if result["changed"]:
            after = {"before": (before or b"").decode(errors="replace"), "after": params["content"]}
            result["diff"] = {"before_header": path, "after_header": path, **after}
            if not module.check_mode:
                write(module, data)
        if before is None and module.check_mode:
            module.exit_json(**result)
        changed = module.set_mode_if_different(path, params["mode"], result["changed"])
        changed = module.set_owner_if_different(path, params["owner"], changed)
        result["changed"] = module.set_group_if_different(path, params["group"], changed)
    except OSError as error:
        module.fail_json(msg=f"cannot write {path}: {error}")
    module.exit_json(**result)


if __name__ == "__main__":
    main()
