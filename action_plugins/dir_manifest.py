"""dir_manifest (documented in library/dir_manifest.py): on the controller it runs in the worker itself;
on a box, as the module. Both run module_utils/content_manifest.py (loaded from its file here: controller
plugins cannot import the repo's module_utils as modules do)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

from ansible.plugins.action import ActionBase

_SPEC = importlib.util.spec_from_file_location(
    "specfleet_content_manifest", Path(__file__).resolve().parents[1] / "module_utils" / "content_manifest.py"
)
content_manifest = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(content_manifest)


class ActionModule(ActionBase):
    TRANSFERS_FILES = False

    def run(self, tmp=None, task_vars=None):
        result = super().run(tmp, task_vars)
        # A controller source (delegate_to: localhost) costs a Python process and the module's packing
        # per call as a module; read as this user, it needs neither.
        if self._connection.transport != "local" or self._play_context.become:
            return {**result, **self._execute_module(task_vars=task_vars)}
        _, args = self.validate_argument_spec(argument_spec=content_manifest.ARGUMENT_SPEC)
        try:
            return {**result, **content_manifest.describe(check_mode=self._task.check_mode, **args)}
        except content_manifest.ManifestError as error:
            return {**result, "failed": True, "msg": str(error)}
