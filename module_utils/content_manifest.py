"""A directory's content manifest on the standard library alone: the dir_manifest module runs it on a box,
and its action (action_plugins/dir_manifest.py) in the controller's own worker, so no module process is
started for a controller source."""

import hashlib
import json
import os
import tempfile
from concurrent.futures import ThreadPoolExecutor

__all__ = ["ARGUMENT_SPEC", "ManifestError", "build_manifest", "describe", "differing", "sha256_file"]

CHUNK = 4 * 1024 * 1024
# dir_manifest's options (documented in library/dir_manifest.py), as the module and its action check them.
ARGUMENT_SPEC = {
    "path": {"type": "path", "required": True},
    "cache": {"type": "path"},
    "exclude": {"type": "list", "elements": "str", "default": []},
    "compare": {"type": "list", "elements": "dict"},
    "workers": {"type": "int", "default": 0},
}


class ManifestError(Exception):
    """Why the directory cannot be described, in one line."""


def sha256_file(path, chunk=CHUNK):
    """The sha256 hex digest of the file at `path`, read `chunk` bytes at a time; OSError if unreadable."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(chunk), b""):
            digest.update(block)
    return digest.hexdigest()


def walk(root, exclude):
    """Relative names of the regular files under root, sorted. A link to a regular file is one, under the
    link's name (a Hugging Face snapshot's files are links into its blobs/; rsync --copy-links ships each as
    the file it points at); a dangling link or a link to a directory is a ManifestError, never left out."""
    names = []
    for directory, subdirs, files in os.walk(root):
        subdirs.sort()
        # os.walk lists a link to a directory among the directories (and does not enter it), a dangling
        # link among the files.
        for name in subdirs:
            full = os.path.join(directory, name)
            if os.path.islink(full) and os.path.relpath(full, root) not in exclude:
                raise ManifestError(
                    f"{full} is a link to a directory: {os.readlink(full)} "
                    "(only links to files are shipped, as the files they point at)"
                )
        for name in files:
            full = os.path.join(directory, name)
            relative = os.path.relpath(full, root)
            if relative in exclude:
                continue
            if os.path.islink(full) and not os.path.exists(full):
                raise ManifestError(f"{full} is a dangling link: {os.readlink(full)} does not exist")
            if os.path.isfile(full):
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


def save_cache(path, cache):
    # Written whole beside the cache, then renamed over it: two plays may describe the same source at
    # once, and a reader sees the old cache or the new one, never part of one.
    directory = os.path.dirname(path) or "."
    os.makedirs(directory, exist_ok=True)
    handle, staged = tempfile.mkstemp(dir=directory, prefix=f".{os.path.basename(path)}.")
    try:
        with os.fdopen(handle, "w") as stream:
            json.dump(cache, stream, indent=1, sort_keys=True)
        os.replace(staged, path)
    except BaseException:
        os.unlink(staged)
        raise


def describe(path, cache=None, exclude=(), compare=None, workers=0, check_mode=False):
    """The module's result for these options (documented in library/dir_manifest.py); the cache is not
    written in check mode. ManifestError says why it cannot be made."""
    if not os.path.isdir(path):
        raise ManifestError(f"{path} is not a directory")
    workers = workers or min(os.cpu_count() or 1, 8)
    try:
        manifest, kept = build_manifest(path, load_cache(cache) if cache else None, exclude, workers)
        if not manifest["files"]:
            raise ManifestError(f"{path} holds no files")
        if cache and not check_mode:
            save_cache(cache, kept)
    except OSError as error:
        raise ManifestError(f"cannot read {path}: {error}") from error
    if compare is not None:
        manifest["differs"] = differing(manifest["files"], compare)
    return {"changed": False, **manifest}
