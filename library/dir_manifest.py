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
  - With I(cache), sha256 values are reused for files whose size and mtime are unchanged, so a
    multi-GB checkpoint that did not change is not read again (only stat'ed).
  - "Files are hashed side by side (I(workers) at once): a checkpoint's shards are many large files, and
    hashing releases the interpreter lock."
  - "With I(compare), the manifest another host made of the same content (a controller's, before a
    transfer), C(differs) names every file missing, extra or different here: what a copy did not get right."
  - Changes nothing but its own cache file (not written in check mode); C(changed) is always false.
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
  description: One entry per regular file, sorted by name.
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

import hashlib
import json
import os
import tempfile
from concurrent.futures import ThreadPoolExecutor

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.specfleet_files import sha256_file


def walk(root, exclude):
    """Relative names of the regular files under root, sorted; symlinks are not followed."""
    names = []
    for directory, subdirs, files in os.walk(root):
        subdirs.sort()
        for name in files:
            full = os.path.join(directory, name)
            relative = os.path.relpath(full, root)
            if relative not in exclude and os.path.isfile(full) and not os.path.islink(full):
                names.append(relative)
    return sorted(names)


def build_manifest(root, cache=None, exclude=(), workers=1):
    """Return (manifest dict, updated cache dict). cache maps name -> {size, mtime_ns, sha256}."""
    cache = cache or {}
    names = walk(root, set(exclude))
    stats = {name: os.stat(os.path.join(root, name)) for name in names}
    known = {}
    for name, stat in stats.items():
        cached = cache.get(name)
        if cached and cached.get("size") == stat.st_size and cached.get("mtime_ns") == stat.st_mtime_ns:
            known[name] = cached["sha256"]
    hashed = [name for name in names if name not in known]
    with ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
        known.update(zip(hashed, pool.map(lambda name: sha256_file(os.path.join(root, name)), hashed)))
    files = [
        {"name": n, "size": stats[n].st_size, "mtime_ns": stats[n].st_mtime_ns, "sha256": known[n]}
        for n in names
    ]
    new_cache = {f["name"]: {k: f[k] for k in ("size", "mtime_ns", "sha256")} for f in files}
    digest = hashlib.sha256(
        "\n".join(f"{f['name']}\0{f['size']}\0{f['sha256']}" for f in files).encode()
    ).hexdigest()
    manifest = {
        "files": files,
        "digest": digest,
        "total_bytes": sum(f["size"] for f in files),
        "hashed": hashed,
    }
    return manifest, new_cache


def differing(files, expected):
    """Names missing from files, extra in them, or of another size or sha256 than in expected."""
    ours = {f["name"]: (f["size"], f["sha256"]) for f in files}
    theirs = {f["name"]: (f.get("size"), f.get("sha256")) for f in expected}
    return sorted(name for name in ours.keys() | theirs.keys() if ours.get(name) != theirs.get(name))


def load_cache(path):
    try:
        with open(path) as handle:
            data = json.load(handle)
        return data if isinstance(data, dict) else {}
    except (OSError, ValueError):
        return {}


def save_cache(module, path, cache):
    directory = os.path.dirname(path) or "."
    os.makedirs(directory, exist_ok=True)
    # Written whole in this run's own temporary directory, then moved into place: two plays may describe
    # the same source at once, and a reader sees the old cache or the new one, never part of one.
    fd, tmp = tempfile.mkstemp(dir=module.tmpdir, prefix="manifest-")
    with os.fdopen(fd, "w") as handle:
        json.dump(cache, handle, indent=1, sort_keys=True)
    module.atomic_move(tmp, path)


def main():
    module = AnsibleModule(
        argument_spec={
            "path": {"type": "path", "required": True},
            "cache": {"type": "path"},
            "exclude": {"type": "list", "elements": "str", "default": []},
            "compare": {"type": "list", "elements": "dict"},
            "workers": {"type": "int", "default": 0},
        },
        supports_check_mode=True,
    )
    root, cache_path = module.params["path"], module.params["cache"]
    if not os.path.isdir(root):
        module.fail_json(msg=f"{root} is not a directory")
    workers = module.params["workers"] or min(os.cpu_count() or 1, 8)
    try:
        manifest, cache = build_manifest(
            root, load_cache(cache_path) if cache_path else None, module.params["exclude"], workers
        )
        if not manifest["files"]:
            module.fail_json(msg=f"{root} holds no files")
        if cache_path and not module.check_mode:
            save_cache(module, cache_path, cache)
    except OSError as exc:
        module.fail_json(msg=f"cannot read {root}: {exc}")
    if module.params["compare"] is not None:
        manifest["differs"] = differing(manifest["files"], module.params["compare"])
    module.exit_json(changed=False, **manifest)


if __name__ == "__main__":
    main()
