"""The box's record of what serves (library/last_good.py), one directory: record.json and a copy of each
recorded file. Its writers are the last_good module and the spec watcher (roles/spec_watch), both under the
box's lock; standard library only, as the watcher runs it with the box's Python."""

import datetime
import hashlib
import json
import os
import shutil
import tempfile

__all__ = ["RECORD", "copy_of", "identity", "merge_files", "merged", "place", "read", "write"]

RECORD = "record.json"


def digest(path):
    """The file's sha256, None when it is not there."""
    if not os.path.isfile(path):
        return None
    sha = hashlib.sha256()
    with open(path, "rb") as source:
        for block in iter(lambda: source.read(1 << 20), b""):
            sha.update(block)
    return sha.hexdigest()


def link_target(path):
    return os.readlink(path) if os.path.islink(path) else None


def identity(files, links, serving):
    """What serves now: file digests, link targets and the serving facts."""
    return {
        "files": {name: digest(path) for name, path in sorted(files.items())},
        "links": {name: link_target(path) for name, path in sorted(links.items())},
        "serving": serving,
    }


def read(directory):
    """The record, None when the box has none (an unreadable one raises OSError or ValueError)."""
    try:
        with open(os.path.join(directory, RECORD)) as handle:
            return json.load(handle)
    except FileNotFoundError:
        return None


def place(write, dest, mode):
    """Write a temporary file beside `dest` with `write(stream)`, then move it into place: a reader never
    sees half of it."""
    handle, temporary = tempfile.mkstemp(dir=os.path.dirname(dest), prefix=".record-")
    try:
        with os.fdopen(handle, "wb") as stream:
            write(stream)
        os.chmod(temporary, mode)
        os.replace(temporary, dest)
    except BaseException:
        if os.path.exists(temporary):
            os.remove(temporary)
        raise


def copy_of(path):
    def write(stream):
        with open(path, "rb") as source:
            shutil.copyfileobj(source, stream)

    return write


def merged(kept, now):
    """The record with `now`'s files and links over its own, and the rest of it as it is."""
    return {
        "files": {**kept["files"], **now["files"]},
        "links": {**kept["links"], **now["links"]},
        "serving": kept["serving"],
    }


def write(directory, files, now, details, best, modes=None):
    """Record `now` (identity()) with a copy of each of `files` that is there; `best(recorded_at)` gives
    the kept best figures. The directory and every file in it are root-only: the environment file may hold
    a key."""
    copies = os.path.join(directory, "files")
    os.makedirs(copies, mode=0o700, exist_ok=True)
    os.chmod(directory, 0o700)
    for name, path in files.items():
        copy = os.path.join(copies, name)
        if now["files"][name]:
            place(copy_of(path), copy, 0o600)
        elif os.path.exists(copy):
            os.remove(copy)
    modes = {
        **(modes or {}),
        **{name: os.stat(path).st_mode & 0o777 for name, path in files.items() if now["files"][name]},
    }
    recorded_at = datetime.datetime.now(datetime.timezone.utc).isoformat()
    kept = dict(now, modes=modes, recorded_at=recorded_at, details=details, best=best(recorded_at))
    text = json.dumps(kept, indent=1, sort_keys=True).encode()
    place(lambda stream: stream.write(text), os.path.join(directory, RECORD), 0o600)
    return kept


def merge_files(directory, files):
    """Record `files` anew into the box's record and keep the rest of it (its other files, links, details
    and figures): a change made between deploys, which a later restore puts back with the rest. None
    (nothing written) on a box without a record."""
    kept = read(directory)
    if kept is None:
        return None
    now = merged(kept, identity(files, {}, kept["serving"]))
    return write(directory, files, now, kept["details"], lambda _: kept.get("best") or {}, kept.get("modes"))
