"""chat_workload (documented in library/chat_workload.py): on the controller it runs in the worker itself;
elsewhere, as the module. Both run module_utils/workload_file.py (loaded from its file here: controller
plugins cannot import the repo's module_utils as modules do)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

from ansible.plugins.action import ActionBase

_SPEC = importlib.util.spec_from_file_location(
    "specfleet_workload_file", Path(__file__).resolve().parents[1] / "module_utils" / "workload_file.py"
)
workload_file = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(workload_file)

ARGUMENT_SPEC = {
    "path": {"type": "path", "required": True},
    "max_tokens": {"type": "int", "default": 64},
    "max_model_len": {"type": "int", "default": 0},
    "greedy_only": {"type": "bool", "default": False},
    "min_distinct": {"type": "int", "default": 0},
}


class ActionModule(ActionBase):
    TRANSFERS_FILES = False

    def run(self, tmp=None, task_vars=None):
        result = super().run(tmp, task_vars)
        # The file is on the controller (delegate_to: localhost): read as this user, it needs no module
        # process (0.4-0.5 s a call).
        if self._connection.transport != "local" or self._play_context.become:
            return {**result, **self._execute_module(task_vars=task_vars)}
        _, args = self.validate_argument_spec(argument_spec=ARGUMENT_SPEC)
        try:
            return {**result, **workload_file.describe(**args)}
        except workload_file.WorkloadError as error:
            return {**result, "failed": True, "msg": str(error)}
