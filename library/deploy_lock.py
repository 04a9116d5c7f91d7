#!/usr/bin/python
"""Ansible module: one deploy at a time on a box, with a lock file that says who holds it."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: deploy_lock
short_description: Take or release the box's deploy lock, naming its holder; stale locks are taken over
description:
  - "C(state=held): creates I(path) holding I(holder), I(token) and the time, unless another run holds
    it. Created with a hard link from a complete temporary file, so of two runs that race for it,
    exactly one gets it and nobody reads half a lock."
  - A lock older than I(stale_after_s) (a run that was killed and could not release it) is taken
    over, and the result says whose it was.
  - "C(state=released): removes I(path) when it holds I(token); a lock of another run is left alone."
  - The lock is run state, not configuration; C(changed) stays false so that a run which changes
    nothing else reports no change.
options:
  state:
    description: Take the lock, or release it.
    type: str
    choices: [held, released]
    default: held
  path:
    description: The lock file.
    type: path
    default: /var/lib/specfleet/deploy.lock
  holder:
    description: Who runs the deploy, as the refusal line shows it to a second operator.
    type: str
    default: ""
  token:
    description: This run's own id on this box; it releases only its own lock.
    type: str
    required: true
  stale_after_s:
    description: Age in seconds after which another run's lock is taken over.
    type: int
    default: 21600
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
- name: One deploy at a time
  deploy_lock:
    holder: alice@ops-laptop
    token: "{{ run_token }}"

- name: Let the next deploy in
  deploy_lock:
    state: released
    token: "{{ run_token }}"
"""

RETURN = r"""
taken_over:
  description: The stale lock this run took over (its holder and time), or null.
  returned: when state is held
  type: dict
lock:
  description: The lock as this run leaves it (holder, token, since), or null after a release.
  returned: always
  type: dict
"""

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.deploy_lock import LOCK_OPTIONS, hold, release


def main():
    module = AnsibleModule(
        argument_spec={
            "state": {"type": "str", "choices": ["held", "released"], "default": "held"},
            **LOCK_OPTIONS,
        },
        supports_check_mode=True,
    )
    params = module.params
    if params["state"] == "held":
        lock, taken_over = hold(
            module, params["path"], params["holder"], params["token"], params["stale_after_s"]
        )
        module.exit_json(changed=False, lock=lock, taken_over=taken_over)
    module.exit_json(changed=False, lock=release(module, params["path"], params["token"]))


if __name__ == "__main__":
    main()
