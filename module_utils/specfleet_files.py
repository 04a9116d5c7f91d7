"""File helpers on the standard library alone.

sha256_file serves the pure functions that the unit tests call directly (a module's own code uses
module.sha256, and a temporary file in module.tmpdir moved into place with module.atomic_move).
replace_link is the link swap that modules share: AnsibleModule has none.
"""

import hashlib
import os

__all__ = ["replace_link", "sha256_file"]

CHUNK = 4 * 1024 * 1024


def sha256_file(path, chunk=CHUNK):
    """The sha256 hex digest of the file at `path`, read `chunk` bytes at a time; OSError if unreadable."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(chunk), b""):
            digest.update(block)
    return digest.hexdigest()


def replace_link(target, path):
    """Point the link at `path` at `target` by renaming a new link over it: a reader sees the old target
    or the new one, never none."""
    temporary = os.path.join(os.path.dirname(path), f".{os.path.basename(path)}.swap")
    if os.path.lexists(temporary):
        os.remove(temporary)
    os.symlink(target, temporary)
    os.replace(temporary, path)
