"""dir_manifest (documented in library/dir_manifest.py): on the controller it runs in the worker itself;
on a box, as the module."""

from __future__ import annotations

import importlib.util
import sys

from ansible.plugins.action import ActionBase
from ansible.plugins.loader import module_utils_loader

SHARED = "specfleet_content_manifest"


def content_manifest():
    """module_utils/content_manifest.py, the code the module ships to a box, imported here by its path."""
    if SHARED not in sys.modules:
        path = module_utils_loader.find_plugin("content_manifest")
        spec = importlib.util.spec_from_file_location(SHARED, path)
        shared = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(shared)
        sys.modules[SHARED] = shared
    return sys.modules[SHARED]


class ActionModule(ActionBase):
    TRANSFERS_FILES = False

    def run(self, tmp=None, task_vars=None):
        result = super().run(tmp, task_vars)
        # A controller source (delegate_to: localhost) costs a Python process and the module's packing
        # per call as a module; read as this user, it needs neither.
        if self._connection.transport != "local" or self._play_context.become:
            return {**result, **self._execute_module(task_vars=task_vars)}
        shared = content_manifest()
        _, args = self.validate_argument_spec(argument_spec=shared.ARGUMENT_SPEC)
        try:
            return {**result, **shared.describe(check_mode=self._task.check_mode, **args)}
        except shared.ManifestError as error:
            return {**result, "failed": True, "msg": str(error)}
