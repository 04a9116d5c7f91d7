"""File helpers on the standard library alone: replace_link is the link swap that modules share
(AnsibleModule has none); make_dirs makes directories with the mode asked, whatever the umask."""

import os

__all__ = ["make_dirs", "replace_link"]


def make_dirs(path, mode=0o755):
    """os.makedirs(path), each directory it makes given `mode` (makedirs' own is narrowed by the umask: under
    027 /var/lib/specfleet would be 0750, and nginx's workers could not reach the loads it serves)."""
    made, missing = [], path
    while missing and not os.path.isdir(missing):
        made.append(missing)
        missing = os.path.dirname(missing)
    os.makedirs(path, exist_ok=True)
    for directory in made:
        os.chmod(directory, mode)


def replace_link(target, path):
    """Point the link at `path` at `target` by renaming a new link over it: a reader sees the old target
    or the new one, never none."""
    temporary = os.path.join(os.path.dirname(path), f".{os.path.basename(path)}.swap")
    if os.path.lexists(temporary):
        os.remove(temporary)
    os.symlink(target, temporary)
    os.replace(temporary, path)
