"""Write a text file on the controller in the worker itself (documented in library/controller_file.py)."""

from __future__ import annotations

import os
import stat
import tempfile

from ansible.plugins.action import ActionBase

ARGUMENT_SPEC = {
    "dest": {"type": "path", "required": True},
    "content": {"type": "str", "required": True},
    "mode": {"type": "str", "default": "0644"},
}


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _requires_connection = False

    def run(self, tmp=None, task_vars=None):
        result = super().run(tmp, task_vars)
        _, args = self.validate_argument_spec(argument_spec=ARGUMENT_SPEC)
        dest, content = args["dest"], args["content"].encode()
        try:
            mode = int(args["mode"], 8)
        except ValueError:
            line = f"mode={args['mode']!r} is not an octal mode such as 0644"
            return {**result, "failed": True, "msg": line}
        directory = os.path.dirname(dest) or "."
        try:
            try:
                with open(dest, "rb") as current:
                    kept_mode = stat.S_IMODE(os.fstat(current.fileno()).st_mode)
                    same = current.read() == content and kept_mode == mode
            except FileNotFoundError:
                same = False
            result.update(dest=dest, changed=not same)
            if same or self._task.check_mode:
                return result
            # The directory gets the file's mode plus search rights wherever the file is readable.
            os.makedirs(directory, mode=mode | (mode & 0o444) >> 2, exist_ok=True)
            handle, staged = tempfile.mkstemp(dir=directory, prefix=f".{os.path.basename(dest)}.")
        except OSError as error:
            return {**result, "failed": True, "msg": f"{dest}: cannot be written: {error.strerror}"}
        try:
            with os.fdopen(handle, "wb") as staging:
                staging.write(content)
            os.chmod(staged, mode)
            os.replace(staged, dest)
        except BaseException:
            os.unlink(staged)
            raise
        return result
