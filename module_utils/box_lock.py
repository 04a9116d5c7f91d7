"""The box's deploy lock, one JSON file: taken by last_good (state=read with lock, so that the record is
read under it) or deploy_lock (state=held), released by deploy_lock. `module` gives fail_json and
check_mode."""

import datetime
import json
import os
import tempfile

__all__ = ["LOCK_OPTIONS", "hold", "release"]

# The lock's options, as deploy_lock takes them and last_good's `lock` does.
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
    os.makedirs(os.path.dirname(path) or ".", mode=0o755, exist_ok=True)
    handle, temporary = tempfile.mkstemp(dir=os.path.dirname(path) or ".", prefix=".deploy-lock.")
    try:
        with os.fdopen(handle, "w") as stream:
            json.dump(lock, stream, sort_keys=True)
        os.chmod(temporary, 0o644)
        os.link(temporary, path)
    finally:
        os.remove(temporary)


def hold(module, path, holder, token, stale_after_s):
    mine = {"holder": holder, "token": token, "since": now().isoformat(timespec="seconds")}
    lock = read_lock(path)
    taken_over = None
    if lock is not None and lock.get("token") == token:
        return lock, None
    if lock is not None:
        age = age_s(lock, path)
        if age < stale_after_s:
            module.fail_json(
                msg=f"another deploy holds this box: {lock.get('holder') or 'unknown'} since "
                f"{lock.get('since', '?')} ({int(age // 60)} min ago); it is taken over as stale after "
                f"{stale_after_s / 3600:g} h, or remove {path} once that run is gone",
                lock={k: lock.get(k) for k in ("holder", "since")},
            )
        taken_over = {k: lock.get(k) for k in ("holder", "since")}
    if module.check_mode:
        return mine, taken_over
    if taken_over is not None:
        os.remove(path)
    try:
        create(module, path, mine)
    except FileExistsError:
        other = read_lock(path) or {}
        module.fail_json(
            msg=f"another deploy took this box's lock just now: {other.get('holder') or 'unknown'}"
        )
    return mine, taken_over


def release(module, path, token):
    lock = read_lock(path)
    if lock is None or lock.get("token") != token:
        return lock
    if not module.check_mode:
        os.remove(path)
    return None
