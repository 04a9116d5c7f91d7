"""A measurement kept on the box with the identity of what it measured (standard library and
AnsibleModule only): read it, replace it atomically, and say which identity fields changed since.
nccl_tune and spec_tune keep theirs this way and reuse them until the identity changes."""

from __future__ import annotations

import json
import os
import tempfile

from ansible.module_utils.specfleet_files import make_dirs

__all__ = ["KeptMeasurementError", "read_kept", "write_kept", "changed_fields"]


class KeptMeasurementError(Exception):
    """The kept file exists but cannot be read; str() is the one-line reason."""


def read_kept(path):
    """The kept JSON object, or None when nothing is kept."""
    try:
        with open(path) as handle:
            return json.load(handle)
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as error:
        raise KeptMeasurementError(f"cannot read the kept measurement {path}: {error}") from error


def write_kept(module, path, kept):
    """Write `kept` whole in the module's temporary directory (removed when the module ends), then
    move it into place: a reader never sees half a file."""
    directory = os.path.dirname(path) or "."
    make_dirs(directory)
    handle, temporary = tempfile.mkstemp(dir=module.tmpdir, prefix=os.path.basename(path) + ".")
    with os.fdopen(handle, "w") as stream:
        json.dump(kept, stream, indent=1, sort_keys=True)
    module.atomic_move(temporary, path)
    os.chmod(path, 0o644)


def changed_fields(kept, current, summarized=()):
    """What differs between two identities ("field old -> new", or "field changed" for the
    `summarized` ones, too long to show); [] when the kept measurement still holds."""
    changes = []
    for field in sorted(set(kept) | set(current)):
        if kept.get(field) != current.get(field):
            if field in summarized:
                changes.append(f"{field} changed")
            else:
                changes.append(f"{field} {kept.get(field)} -> {current.get(field)}")
    return changes
