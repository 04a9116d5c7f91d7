#!/usr/bin/python
"""Ansible module: look for a release on the box and, when it is not published, ready its staging."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: release_stage
short_description: Look for a published release and whether it serves; else ready its staging
description:
  - "A release is published when C(<releases>/<release>/.release.json) exists (M(release_switch) writes it
    last). With I(link), it also says whether that link already points at the release: a published release
    that serves needs nothing more (not even M(release_switch)'s look at the link), and the run costs this
    one call."
  - "For a release not yet published, I(releases) is created (owner root, mode 0755) where it is missing,
    and the path of C(rsync) on the box's C(PATH) is reported: the far end of the transfer that stages the
    release (C(ansible.posix.synchronize)), installed by the caller only where it is missing."
  - "One call instead of a stat, a directory and a package check: the look runs on every deploy, the rest
    only where a release is new (docs/benchmarks.md, why a no-change run is cheap)."
options:
  releases:
    description: Directory holding the releases (C(<id>/) published, C(<id>.partial/) staging).
    type: path
    required: true
  release:
    description: The id of the release to look for.
    type: str
    required: true
  link:
    description: The link that serves a release (M(release_switch)'s I(link)); none when empty.
    type: path
    default: ""
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
- name: Look for drafter release 3f2a9c1b7d04 on the box
  release_stage:
    releases: /srv/drafters/releases
    release: 3f2a9c1b7d04
    link: /srv/drafters/current
  register: staged

- name: Install rsync where a new release needs it
  ansible.builtin.apt:
    name: rsync
  when: not staged.published and not staged.rsync
"""

RETURN = r"""
published:
  description: Whether the release is published (its C(.release.json) exists).
  returned: success
  type: bool
  sample: false
serves:
  description: Whether I(link) points at the release (false without I(link)).
  returned: success
  type: bool
  sample: true
rsync:
  description: The path of rsync on the box, or null where it is missing; null as well for a published
    release, which is not looked for.
  returned: success
  type: str
  sample: /usr/bin/rsync
"""

import os
import shutil

from ansible.module_utils.basic import AnsibleModule


def main():
    module = AnsibleModule(
        argument_spec={
            "releases": {"type": "path", "required": True},
            "release": {"type": "str", "required": True},
            "link": {"type": "path", "default": ""},
        },
        supports_check_mode=True,
    )
    releases, release, link = (module.params[name] for name in ("releases", "release", "link"))
    path = os.path.join(releases, release)
    if os.path.exists(os.path.join(path, ".release.json")):
        serves = bool(link) and os.path.islink(link) and os.path.realpath(link) == os.path.realpath(path)
        module.exit_json(changed=False, published=True, serves=serves, rsync=None)
    changed = not os.path.isdir(releases)
    if changed and not module.check_mode:
        os.makedirs(releases, mode=0o755)
        # makedirs' mode is masked by the umask; the releases are read by the service user.
        os.chmod(releases, 0o755)
        os.chown(releases, 0, 0)
    module.exit_json(changed=changed, published=False, serves=False, rsync=shutil.which("rsync"))


if __name__ == "__main__":
    main()
