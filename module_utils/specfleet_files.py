"""File helpers on the standard library alone: replace_link is the link swap that modules share
(AnsibleModule has none)."""

import os

__all__ = ["replace_link"]


def replace_link(target, path):
    """Point the link at `path` at `target` by renaming a new link over it: a reader sees the old target
    or the new one, never none."""
    temporary = os.path.join(os.path.dirname(path), f".{os.path.basename(path)}.swap")
    if os.path.lexists(temporary):
        os.remove(temporary)
    os.symlink(target, temporary)
    os.replace(temporary, path)
