"""File helpers for code that runs without an AnsibleModule at hand (standard library only).

A module's own code uses AnsibleModule's helpers instead: module.sha256(path), and a temporary file in
module.tmpdir moved into place with module.atomic_move(tmp, dest). What is here serves the pure
functions that the unit tests call directly.
"""

import hashlib

__all__ = ["sha256_file"]

CHUNK = 4 * 1024 * 1024


def sha256_file(path, chunk=CHUNK):
    """The sha256 hex digest of the file at `path`, read `chunk` bytes at a time; OSError if unreadable."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(chunk), b""):
            digest.update(block)
    return digest.hexdigest()
