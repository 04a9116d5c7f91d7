"""The box's deploy lock, one JSON file: taken (state=held) and released by deploy_lock. `module` gives
fail_json and check_mode."""

import contextlib
import datetime
import fcntl
import json
import os
import tempfile

from .specfleet_files import make_dirs

__all__ = ["LOCK_OPTIONS", "hold", "release"]

# The lock's options, as deploy_lock takes them.
LOCK_OPTIONS = {
    "path": {"type": "path", "default": "/var/lib/specfleet/deploy.lock"},
    "holder": {"type": "str", "default": ""},
    "token": {"type": "str", "required": True, "no_log": False},
    "stale_after_s": {"type": "int", "default": 21600},
}


def now():
    return datetime.datetime.now(datetime.timezone.utc)


def read_lock(path):
    """The lock's content, {} for an unreadable one (a crash mid-write of an older format), None if absent."""
    try:
        with open(path) as handle:
            lock = json.load(handle)
        return lock if isinstance(lock, dict) else {}
    except FileNotFoundError:
        return None
    except (OSError, ValueError):
        return {}


def age_s(lock, path):
    try:
        since = datetime.datetime.fromisoformat(lock["since"])
    except (KeyError, TypeError, ValueError):
        since = datetime.datetime.fromtimestamp(os.stat(path).st_mtime, datetime.timezone.utc)
    return (now() - since).total_seconds()


def create(module, path, lock):
    """Link a complete file to `path`: fails with FileExistsError when another run got there first."""
    make_dirs(os.path.dirname(path) or ".")
    handle, temporary = tempfile.mkstemp(dir=os.path.dirname(path) or ".", prefix=".deploy-lock.")
    try:
        with os.fdopen(handle, "w") as stream:
            json.dump(lock, stream, sort_keys=True)
        os.chmod(temporary, 0o644)
        os.link(temporary, path)
    finally:
        os.remove(temporary)


@contextlib.contextmanager
def guarded(path):
    """Every take-over and release of the lock on this box, one at a time: an exclusive flock on the
    lock's directory. Two runs that both found a stale lock would otherwise both remove it, and the
    second would remove the first one's new lock."""
    directory = os.path.dirname(path) or "."
    make_dirs(directory)
    handle = os.open(directory, os.O_RDONLY)
    try:
        fcntl.flock(handle, fcntl.LOCK_EX)
        yield
    finally:
        os.close(handle)


def judge(module, path, token, stale_after_s):
    """(the lock there now, whose stale lock this run takes over); fails while another run holds it."""
    lock = read_lock(path)
    if lock is None or lock.get("token") == token:
        return lock, None
    age = age_s(lock, path)
    if age < stale_after_s:
        module.fail_json(
            msg=f"another deploy holds this box: {lock.get('holder') or 'unknown'} since "
            f"{lock.get('since', '?')} ({int(age // 60)} min ago); it is taken over as stale after "
            f"{stale_after_s / 3600:g} h, or remove {path} once that run is gone",
            lock={k: lock.get(k) for k in ("holder", "since")},
        )
    return lock, {k: lock.get(k) for k in ("holder", "since")}


def hold(module, path, holder, token, stale_after_s):
    mine = {"holder": holder, "token": token, "since": now().isoformat(timespec="seconds")}
    if module.check_mode:
        lock, taken_over = judge(module, path, token, stale_after_s)
        return (lock if taken_over is None and lock is not None else mine), taken_over
    with guarded(path):
        lock, taken_over = judge(module, path, token, stale_after_s)
        if lock is not None and taken_over is None:
            return lock, None  # this run's own lock (a second entry point)
        if taken_over is not None:
            os.remove(path)
        try:
            create(module, path, mine)
        except FileExistsError:  # a run of an older release, which takes no guard
            other = read_lock(path) or {}
            module.fail_json(
                msg=f"another deploy took this box's lock just now: {other.get('holder') or 'unknown'}"
            )
    return mine, taken_over


def release(module, path, token):
    lock = read_lock(path)
    if lock is None or lock.get("token") != token:
        return lock
    if module.check_mode:
        return None
    with guarded(path):
        lock = read_lock(path)
        if lock is None or lock.get("token") != token:  # taken over as stale meanwhile
            return lock
        os.remove(path)
    return None
