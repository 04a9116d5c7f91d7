#!/usr/bin/python
"""Ansible module: publish a staged release, point the served link at it, prune old releases."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: release_switch
short_description: Publish a staged release, point a link at it atomically, keep the one it replaces
description:
  - "Releases live in I(releases) as C(<id>) directories; a copy still being staged is C(<id>.partial).
    A release not yet published is published first: I(record) is written into the staged copy as
    C(.release.json), then C(<id>.partial) is renamed to C(<id>), so the release appears whole or not at all."
  - "I(link) is then pointed at the release by renaming a new link over it: a reader sees the old target
    or the new one, never none. With I(previous), that link is pointed at the release I(link) left
    (where a rollback goes back to)."
  - "Only where I(link) moves, the releases beyond the I(keep) newest are removed, never the one
    I(link) points at, the one it left, nor one that I(protect) names (the box's last known good, which a
    restore puts back even when a failed state was kept). A run where I(link) already points at the
    release changes nothing and costs one call: it reads the link and nothing else."
  - "Where I(link) moves, the staged copies of other releases (every other C(<id>.partial) in I(releases):
    a transfer abandoned halfway, a checkpoint that failed its checks) are removed too, whatever I(keep)
    says; the staged copy of the release switched to is published, never removed. A transfer that resumes
    an abandoned copy starts again once a switch to another release removed it."
  - "In check mode nothing is written; a release that check mode did not stage is reported as one that
    would be published."
options:
  releases:
    description: Directory holding the releases.
    type: path
    required: true
  release:
    description: The id of the release to serve (a directory name in I(releases)).
    type: str
    required: true
  link:
    description: The link the server reads. A missing one is created; anything there that is not a link
      is left alone and the module fails.
    type: path
    required: true
  previous:
    description: A link pointed at the release I(link) leaves, when it leaves one; none when empty.
    type: path
    default: ""
  keep:
    description: Releases kept when I(link) moves, newest first by modification time.
    type: int
    default: 3
  protect:
    description: Releases never pruned, as paths (a link is resolved); paths outside I(releases) are ignored.
    type: list
    elements: path
    default: []
  record:
    description: Written as C(.release.json) (mode 0644) into a release that is published in this run.
    type: dict
    default: {}
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
- name: Serve drafter release 3f2a9c1b7d04, published from its staged copy when it is new
  release_switch:
    releases: /srv/drafters/releases
    release: 3f2a9c1b7d04
    link: /srv/drafters/current
    previous: /srv/drafters/previous
    keep: 3
    protect: [/srv/drafters/releases/0b7c41d2e9aa]
    record:
      id: 3f2a9c1b7d04
      source: /data/drafters/kimi-k25-eagle3
  notify: vllm_service restart
"""

RETURN = r"""
path:
  description: The release I(link) points at after this run.
  returned: success
  type: str
  sample: /srv/drafters/releases/3f2a9c1b7d04
replaced:
  description: Where I(link) pointed before this run (the same as C(path) when it did not move), or an
    empty string when there was no link.
  returned: success
  type: str
published:
  description: Whether the release was published from its staged copy in this run (or would be, in
    check mode).
  returned: success
  type: bool
pruned:
  description: What was removed (or would be, in check mode) where I(link) moved, as paths; the releases
    beyond the I(keep) newest, then the staged copies (C(<id>.partial)) of other releases, sorted by name.
  returned: success
  type: list
  elements: str
"""

import json
import os
import shutil
import tempfile

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.specfleet_files import replace_link

RECORD = ".release.json"


def link_target(module, path):
    """The resolved target of the link at `path`, '' when nothing is there."""
    if os.path.islink(path):
        return os.path.realpath(path)
    if os.path.lexists(path):
        module.fail_json(msg=f"{path} is not a link: move it aside so that releases can be served through it")
    return ""


def published_releases(releases):
    """(modification time, path) of each published release; staged copies and hidden entries left out."""
    if not os.path.isdir(releases):
        return []
    return [
        (entry.stat().st_mtime, entry.path)
        for entry in os.scandir(releases)
        if entry.is_dir(follow_symlinks=False)
        and not entry.name.endswith(".partial")
        and not entry.name.startswith(".")
    ]


def staged_copies(releases, staged):
    """The staged copies (<id>.partial directories) in releases other than `staged`, sorted by path."""
    if not os.path.isdir(releases):
        return []
    return sorted(
        entry.path
        for entry in os.scandir(releases)
        if entry.is_dir(follow_symlinks=False)
        and entry.name.endswith(".partial")
        and not entry.name.startswith(".")
        and entry.path != staged
    )


def publish(staged, release, record):
    """Write the record into the staged copy, then rename it into place."""
    if record:
        handle, temporary = tempfile.mkstemp(dir=staged, prefix=".release.")
        with os.fdopen(handle, "w") as stream:
            stream.write(json.dumps(record, indent=4, sort_keys=True) + "\n")
        os.chmod(temporary, 0o644)
        os.replace(temporary, os.path.join(staged, RECORD))
    os.rename(staged, release)


def main():
    module = AnsibleModule(
        argument_spec={
            "releases": {"type": "path", "required": True},
            "release": {"type": "str", "required": True},
            "link": {"type": "path", "required": True},
            "previous": {"type": "path", "default": ""},
            "keep": {"type": "int", "default": 3},
            "protect": {"type": "list", "elements": "path", "default": []},
            "record": {"type": "dict", "default": {}},
        },
        supports_check_mode=True,
    )
    params = module.params
    if not params["release"] or "/" in params["release"] or params["release"].startswith("."):
        module.fail_json(msg=f"release {params['release']!r} is not a release id (a directory name)")
    if params["keep"] < 1:
        module.fail_json(msg=f"keep is {params['keep']}: at least the served release is kept")
    # Resolved, as the link's target is: a releases path through a link names the same releases.
    releases = os.path.realpath(params["releases"])
    release = os.path.join(releases, params["release"])
    staged = f"{release}.partial"
    replaced = link_target(module, params["link"])
    result = {"changed": False, "path": release, "replaced": replaced, "published": False, "pruned": []}
    if replaced == release:
        module.exit_json(**result)

    result["changed"] = True
    link = params["link"]
    result["diff"] = {"before": f"{link} -> {replaced}\n", "after": f"{link} -> {release}\n"}
    if not os.path.isdir(release):
        if not os.path.isdir(staged) and not module.check_mode:
            module.fail_json(
                msg=f"release {params['release']} is neither published nor staged in {params['releases']}"
            )
        result["published"] = True
    kept = {release, replaced, *(os.path.realpath(path) for path in params["protect"])}
    newest_first = [path for _, path in sorted(published_releases(releases), reverse=True)]
    if result["published"]:
        newest_first.insert(0, release)
    result["pruned"] = [path for path in newest_first[params["keep"] :] if path not in kept]
    # Abandoned transfers of other releases (weights: hundreds of GB) go with the link's move.
    result["pruned"] += staged_copies(releases, staged)
    if module.check_mode:
        module.exit_json(**result)

    try:
        if result["published"]:
            publish(staged, release, params["record"])
        if params["previous"] and replaced:
            replace_link(replaced, params["previous"])
        replace_link(release, link)
        for path in result["pruned"]:
            shutil.rmtree(path)
    except OSError as error:
        module.fail_json(msg=f"cannot serve release {params['release']} through {link}: {error}")
    module.exit_json(**result)


if __name__ == "__main__":
    main()
