#!/usr/bin/python
"""Ansible module: the box's record of the last configuration that served and passed its checks."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: last_good
short_description: Record what serves on a box after it passed its checks, and put it back after a failure
description:
  - "C(state=recorded): keeps copies of I(files) (the unit file, which holds the speculative config and
    the NCCL environment, and the root-only environment file), the targets of I(links) (the drafter's
    C(current) release) and I(serving) (the vLLM version, the patch state) in I(dir), with I(details)
    and the date. Written only when what serves differs from the record (the figures of a later pass
    of the same configuration do not rewrite it), so a run that changes nothing reports no change."
  - "C(state=restored): puts the recorded files and link targets back where they differ, and says which
    I(serving) values it cannot put back itself (the caller acts on those, or reports them)."
  - "C(state=read): returns the record and changes nothing (the deploy lock is M(deploy_lock)'s;
    roles/transaction takes it before it reads the record)."
  - "The record directory and every file in it are root-only, since the environment file may hold
    the API key. Nothing secret is returned, only names, link targets, I(serving) and I(details)."
options:
  state:
    description: What to do with the record.
    type: str
    choices: [read, recorded, restored]
    default: read
  dir:
    description: Directory holding the record (created root-only).
    type: path
    default: /var/lib/specfleet/last_good
  files:
    description: Name and path of each file whose content is part of what serves; a missing file is
      recorded as absent, and removed again by a restore.
    type: dict
    default: {}
  links:
    description: Name and path of each symbolic link whose target is part of what serves; a missing
      link is recorded as absent.
    type: dict
    default: {}
  serving:
    description: Other facts of what serves, compared with the record (with I(state=restored), the
      differences are returned in C(not_restored)).
    type: dict
    default: {}
  details:
    description: Kept with the record for reading, not compared (the gate's figures, the speculative
      config and NCCL environment the unit file holds).
    type: dict
    default: {}
  merge:
    description:
      - With I(state=recorded), record only the given I(files) and I(links) anew, into the box's record, and
        keep the rest of it as it is (its other files and links, I(serving), I(details) and figures). After a
        change to the proxy alone, what clients reach is recorded and the server behind it stays as judged.
      - A box without a record records nothing.
    type: bool
    default: false
  measured:
    description:
      - The checks' figures to rank, C(key) (the workload and k they were measured on) and C(figures)
        (C(mean_acceptance_length), C(tokens_per_second)). A new record keeps, per key, the best of each
        figure ever recorded with its date (C(best)), which the gate compares a later change with.
    type: dict
    default: {}
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
- name: Record what serves
  last_good:
    state: recorded
    files:
      unit: /etc/systemd/system/vllm.service
      environment: /etc/vllm/vllm.env
    links:
      drafter: /srv/drafters/current
    serving:
      vllm_version: 0.33.0
    details:
      gate: {acceptance_rate: 0.81}

- name: What a failure would go back to
  last_good:
    state: read

- name: Put it back after a failed change
  last_good:
    state: restored
    files:
      unit: /etc/systemd/system/vllm.service
      environment: /etc/vllm/vllm.env
    links:
      drafter: /srv/drafters/current
    serving:
      vllm_version: 0.34.0
  register: restore
"""

RETURN = r"""
ansible_facts:
  description: C(last_good), the record after this run; C(recorded) false when the box has none.
  returned: always
  type: dict
  sample:
    last_good:
      recorded: true
      recorded_at: "2026-12-02T09:00:00+00:00"
      files: {unit: present, environment: absent}
      links: {drafter: /srv/drafters/releases/3f2a9c}
      serving: {vllm_version: 0.33.0}
      details: {gate: {acceptance_rate: 0.81}}
      best: {3f2a9c: {mean_acceptance_length: 3.37, mean_acceptance_length_at: "2026-12-02T09:00:00+00:00"}}
restored:
  description: What was put back (or would be, in check mode), one line each.
  returned: when state is restored
  type: list
  elements: str
  sample: ["unit file", "drafter link -> /srv/drafters/releases/3f2a9c"]
not_restored:
  description: I(serving) values that differ from the record, each with its value now and the recorded one.
  returned: when state is restored
  type: list
  elements: str
changes:
  description: What differs between the record and the box now (files, links, serving), one line each.
  returned: always
  type: list
  elements: str
"""

import os
from functools import partial

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.last_good import copy_of, identity, merged, place, read, write
from ansible.module_utils.specfleet_files import replace_link

PARTS = ("files", "links", "serving")


def differences(record, now, part):
    """One line per file, link or serving value (`part`) that differs between the record and now."""
    lines = []
    for name in sorted(set(record[part]) | set(now[part])):
        old, new = record[part].get(name), now[part].get(name)
        if old == new:
            continue
        lines.append(f"{name} file" if part == "files" else f"{name} {new} (last good: {old})")
    return lines


def public(record):
    """The record without file digests (a digest of the environment file would describe the API key)."""
    if record is None:
        return {"recorded": False}
    return {
        "recorded": True,
        "recorded_at": record["recorded_at"],
        "files": {name: "present" if digest else "absent" for name, digest in record["files"].items()},
        "links": record["links"],
        "serving": record["serving"],
        "details": record["details"],
        "best": record.get("best") or {},
    }


def read_record(module, directory):
    try:
        return read(directory)
    except (OSError, ValueError) as error:
        module.fail_json(msg=f"cannot read the last known good record in {directory}: {error}")


def best_of(kept, measured, recorded_at):
    """The best figures per workload: the earlier best ({key: {figure: value, figure_at: date}}) raised
    by this record's measured figures ({key, figures}) wherever they are higher."""
    best = {key: dict(figures) for key, figures in ((kept or {}).get("best") or {}).items()}
    if measured and measured.get("key"):
        entry = best.setdefault(measured["key"], {})
        for figure, value in (measured.get("figures") or {}).items():
            if value is not None and (entry.get(figure) is None or value > entry[figure]):
                entry[figure], entry[f"{figure}_at"] = value, recorded_at
    return best


def restore(module, directory, kept, files, links, now):
    """Put back each differing file and link; returns one line per thing put back."""
    restored = []
    for name, path in sorted(files.items()):
        if kept["files"].get(name, None) == now["files"][name]:
            continue
        if name not in kept["files"]:
            continue  # not part of the record: nothing to go back to
        restored.append(f"{name} file")
        if module.check_mode:
            continue
        if kept["files"][name]:
            copy = os.path.join(directory, "files", name)
            if module.sha256(copy) != kept["files"][name]:
                module.fail_json(msg=f"the last known good copy of {name} ({copy}) does not match its record")
            place(copy_of(copy), path, kept["modes"][name])
        else:
            os.remove(path)
    for name, path in sorted(links.items()):
        target = kept["links"].get(name)
        if name not in kept["links"] or target == now["links"][name]:
            continue
        if target and not os.path.exists(target):
            module.fail_json(
                msg=f"the last known good {name} {target} is gone: cannot point {path} back at it"
            )
        restored.append(f"{name} link -> {target}" if target else f"{name} link removed")
        if module.check_mode:
            continue
        if target:
            replace_link(target, path)
        else:
            os.remove(path)
    return restored


def main():
    module = AnsibleModule(
        argument_spec={
            "state": {"type": "str", "choices": ["read", "recorded", "restored"], "default": "read"},
            "dir": {"type": "path", "default": "/var/lib/specfleet/last_good"},
            "files": {"type": "dict", "default": {}},
            "links": {"type": "dict", "default": {}},
            "serving": {"type": "dict", "default": {}},
            "details": {"type": "dict", "default": {}},
            "measured": {"type": "dict", "default": {}},
            "merge": {"type": "bool", "default": False},
        },
        supports_check_mode=True,
    )
    params = module.params
    state, directory = params["state"], params["dir"]
    files, links = params["files"], params["links"]
    kept = read_record(module, directory)
    now = identity(files, links, params["serving"])
    if params["merge"] and kept:
        now = merged(kept, now)
    changes = [line for part in PARTS for line in differences(kept, now, part)] if kept else []
    result = {"changed": False, "ansible_facts": {"last_good": public(kept)}, "changes": changes}

    if state == "recorded" and (kept is None or changes) and not (params["merge"] and kept is None):
        result["changed"] = True
        if not module.check_mode:
            # Merged, the server's details and figures stay the record's: nothing judged it anew.
            merge = params["merge"]
            details, modes = (kept["details"], kept.get("modes")) if merge else (params["details"], None)
            best = partial(best_of, kept, {} if merge else params["measured"])
            kept = write(directory, files, now, details, best, modes)
            result["ansible_facts"]["last_good"] = public(kept)
    elif state == "restored":
        result["restored"] = restore(module, directory, kept, files, links, now) if kept else []
        result["not_restored"] = differences(kept, now, "serving") if kept else []
        result["changed"] = bool(result["restored"])
    module.exit_json(**result)


if __name__ == "__main__":
    main()
