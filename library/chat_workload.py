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
    file is.
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

import json

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.chat_load import distinct_requests


class WorkloadError(Exception):
    """str() is the one-line reason."""


def check_request(request, max_tokens, max_model_len, greedy_only=False):
    """One line on what is wrong with a parsed line, or None."""
    if not isinstance(request, dict):
        return f"is a JSON {type(request).__name__}, not an object (a chat request)"
    messages = request.get("messages")
    if not isinstance(messages, list) or not messages:
        return "has no messages (a non-empty list of chat messages)"
    if not all(isinstance(message, dict) and isinstance(message.get("role"), str) for message in messages):
        return "has a message that is not an object with a role"
    tokens = request.get("max_tokens", max_tokens)
    if not isinstance(tokens, int) or isinstance(tokens, bool) or tokens < 1:
        return f"has max_tokens {tokens!r}, not a whole number of at least 1"
    temperature = request.get("temperature", 0)
    if not isinstance(temperature, (int, float)) or isinstance(temperature, bool) or temperature < 0:
        return f"has temperature {temperature!r}, not a number of at least 0"
    if greedy_only and temperature > 0:
        return (
            f"samples (temperature {temperature}): vLLM's CPU build ends its engine on a sampled request "
            "when it speculates; send temperature 0"
        )
    if max_model_len and tokens >= max_model_len:
        return (
            f"asks for max_tokens {tokens}, but the server's context is {max_model_len} tokens "
            "(prompt and completion together)"
        )
    return None


def read_workload(text, path, max_tokens=64, max_model_len=0, greedy_only=False):
    """The requests of a JSONL text; raises WorkloadError naming the first bad line."""
    requests = []
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            request = json.loads(line)
        except ValueError as exc:
            raise WorkloadError(
                f"{path} line {number} is not JSON ({exc}): a JSONL file has one request a line"
            ) from None
        problem = check_request(request, max_tokens, max_model_len, greedy_only)
        if problem:
            raise WorkloadError(f"{path} line {number} {problem}")
        requests.append(request)
    if not requests:
        raise WorkloadError(f"{path} holds no request (one JSON chat request a line)")
    return requests


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
    path = module.params["path"]
    try:
        with open(path, "rb") as handle:
            raw = handle.read()
        text = raw.decode("utf-8")
    except OSError as exc:
        module.fail_json(msg=f"cannot read the workload file {path}: {exc.strerror}")
    except UnicodeDecodeError as exc:
        module.fail_json(msg=f"{path} is not UTF-8 text ({exc.reason} at byte {exc.start}): not a JSONL file")
    try:
        requests = read_workload(
            text,
            path,
            module.params["max_tokens"],
            module.params["max_model_len"],
            module.params["greedy_only"],
        )
    except WorkloadError as exc:
        module.fail_json(msg=str(exc))
    distinct = len(distinct_requests(requests, module.params["max_tokens"], 0))
    if distinct < module.params["min_distinct"]:
        module.fail_json(
            msg=(
                f"{path} holds {distinct} distinct requests in {len(requests)}: the measurement needs at "
                f"least {module.params['min_distinct']} (identical requests count once, at temperature 0 a "
                "repeat repeats its outcome)"
            )
        )
    module.exit_json(
        changed=False, requests=requests, count=len(requests), distinct=distinct, sha256=module.sha256(path)
    )


if __name__ == "__main__":
    main()
