#!/usr/bin/python
"""Ansible module: a content manifest of a directory, re-hashing only files that changed."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: dir_manifest
short_description: List a directory's files with size, mtime and sha256, and a digest of the whole
description:
  - "Walks I(path) and returns every regular file with its size, modification time and sha256, plus
    C(digest), the sha256 of the sorted (name, size, sha256) list. The digest names a release: the
    same content gives the same digest wherever it lies."
  - "A link to a regular file is listed under the link's name with what it points at (size, modification
    time, sha256): a Hugging Face cache snapshot's files are links into its C(blobs/), and a transfer that
    follows links (rsync C(--copy-links)) makes each the regular file it points at, so the copy's manifest
    and digest are the same. A dangling link or a link to a directory fails the module, in one line naming
    it, unless I(exclude) leaves it out; other files that are not regular (sockets, pipes) are left out."
  - With I(cache), sha256 values are reused for files whose size and mtime are unchanged, so a
    multi-GB checkpoint that did not change is not read again (only stat'ed).
  - "Files are hashed side by side (I(workers) at once): a checkpoint's shards are many large files, and
    hashing releases the interpreter lock."
  - "With I(compare), the manifest another host made of the same content (a controller's, before a
    transfer), C(differs) names every file missing, extra or different here: what a copy did not get right."
  - Changes nothing but its own cache file (not written in check mode); C(changed) is always false.
  - "On the controller (a local connection without C(become), as with C(delegate_to: localhost)), its
    action (action_plugins/dir_manifest.py) runs the same code in the controller's own worker: no module
    process is started."
options:
  path:
    description: Directory to describe.
    type: path
    required: true
  cache:
    description: JSON file that keeps sha256 values between runs, keyed by name, size and mtime.
    type: path
  exclude:
    description: File names (relative to I(path)) left out of the manifest.
    type: list
    elements: str
    default: []
  compare:
    description: The C(files) of a manifest to compare with (C(name), C(size), C(sha256) of each).
    type: list
    elements: dict
  workers:
    description: Files hashed at once; 0 takes the number of CPUs, at most 8.
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
- name: Describe the drafter checkpoint on the controller
  dir_manifest:
    path: /data/drafters/kimi-k25-eagle3
    cache: ~/.cache/specfleet/manifests/kimi-k25-eagle3.json
  delegate_to: localhost
  register: drafter_manifest

- name: Check a staged copy on the box against the controller's manifest
  dir_manifest:
    path: /srv/models/Kimi-K2.5.releases/3f2a9c1b7d04.partial
    compare: "{{ controller_manifest.files }}"
  register: staged
  failed_when: staged.differs | length > 0
"""

RETURN = r"""
files:
  description: One entry per regular file or link to one, sorted by name.
  returned: success
  type: list
  elements: dict
  sample: [{"name": "config.json", "size": 675, "mtime_ns": 1764400000000000000, "sha256": "ab12..."}]
digest:
  description: sha256 over the sorted (name, size, sha256) triples.
  returned: success
  type: str
total_bytes:
  description: Sum of the file sizes.
  returned: success
  type: int
hashed:
  description: Names of the files whose sha256 was computed in this run (not taken from the cache).
  returned: success
  type: list
  elements: str
differs:
  description: With I(compare), the names of the files missing here, extra here, or of another size or
    sha256, sorted.
  returned: when I(compare) is given
  type: list
  elements: str
  sample: ["model-00001-of-00064.safetensors"]
"""

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.content_manifest import ARGUMENT_SPEC, ManifestError, describe


def main():
    module = AnsibleModule(argument_spec=ARGUMENT_SPEC, supports_check_mode=True)
    try:
        result = describe(check_mode=module.check_mode, **module.params)
    except ManifestError as error:
        module.fail_json(msg=str(error))
    module.exit_json(**result)


if __name__ == "__main__":
    main()
