#!/usr/bin/python
"""Ansible module: read an operator's JSONL file of real chat requests as a measurement workload."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: chat_workload
short_description: Read a JSONL file of real chat requests as the workload of a measurement
description:
  - Reads a file with one chat completion request per line (JSON Lines), as an operator exports real
    traffic, checks every line and returns the requests with the file's sha256, for roles/gate's smoke
    test (the C(requests) option of M(speculation_gate)).
  - A line is a JSON object with a non-empty C(messages) list of objects, each with a C(role); C(max_tokens)
    and C(temperature) are optional (a whole number of at least 1, a number of at least 0); any other key is
    kept as it is. Blank lines are skipped.
  - With O(max_model_len) (the server's context), a request whose C(max_tokens), or O(max_tokens) where it
    has none, leaves no room for a prompt (C(max_tokens) >= O(max_model_len)) is refused, as the server
    would refuse it.
  - "With O(greedy_only), a request that samples (a C(temperature) above 0) is refused: vLLM's CPU build ends
    its engine on a sampled request when it speculates (docs/sim.md, what the CPU build does not do)."
  - "With O(min_distinct), a file with fewer distinct requests is refused: at temperature 0 a repeated
    request repeats its outcome, so identical requests (the same body once O(max_tokens) and temperature 0
    are filled in) count once, and the measurement's interval needs that many."
  - Each problem is one line naming the file (and the line number, for a bad line). Changes nothing;
    C(changed) is always C(false). Meant to run on the controller (C(delegate_to) localhost), where the
    file is; there its action (action_plugins/chat_workload.py) runs the same code in the controller's own
    worker, without a module process.
options:
  path:
    description: The JSONL file.
    type: path
    required: true
  max_tokens:
    description: The C(max_tokens) a request without its own is sent with.
    type: int
    default: 64
  max_model_len:
    description: The server's context length in tokens (C(--max-model-len)); 0 skips that check.
    type: int
    default: 0
  greedy_only:
    description: Refuse requests at a temperature above 0 (a server on vLLM's CPU build).
    type: bool
    default: false
  min_distinct:
    description: The fewest distinct requests the file must hold; 0 checks nothing.
    type: int
    default: 0
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
- name: Read the operator's traffic sample
  chat_workload:
    path: "{{ gate_workload_file }}"
    max_tokens: "{{ gate_max_tokens }}"
    max_model_len: 32768
  delegate_to: localhost
  become: false
  register: workload
"""

RETURN = r"""
requests:
  description: The requests, in file order.
  returned: success
  type: list
  elements: dict
  sample: [{"messages": [{"role": "user", "content": "Summarise this ticket ..."}], "max_tokens": 256}]
count:
  description: Number of requests.
  returned: success
  type: int
  sample: 200
distinct:
  description: Number of distinct requests (identical bodies count once).
  returned: success
  type: int
  sample: 198
sha256:
  description: sha256 of the file's bytes.
  returned: success
  type: str
  sample: 9f2c0e1d5b7a4c3e8f6d2b1a0c9e8d7f6a5b4c3d2e1f0a9b8c7d6e5f4a3b2c1d
"""

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.workload_file import WorkloadError, describe


def main():
    module = AnsibleModule(
        argument_spec=dict(
            path=dict(type="path", required=True),
            max_tokens=dict(type="int", default=64),
            max_model_len=dict(type="int", default=0),
            greedy_only=dict(type="bool", default=False),
            min_distinct=dict(type="int", default=0),
        ),
        supports_check_mode=True,
    )
    try:
        module.exit_json(**describe(**module.params))
    except WorkloadError as exc:
        module.fail_json(msg=str(exc))


if __name__ == "__main__":
    main()
